"""The host: posture checks, the PEP 578 audit hook, secret handles, TLS contexts, the halt and
the metrics.
"""
