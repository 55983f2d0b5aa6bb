"""Egress: the outbound contract, the one guarded client, downstream credentials and RFC 9421
signatures.
"""
