"""The lifecycle of one proposal: the pipeline, its wire answers, host ceilings, shadow
reports and startup reconciliation.
"""
