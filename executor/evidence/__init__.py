"""Evidence: the tamper-evident streams, their verifiers, redaction, incident bundles and the plan
audit sink.
"""
