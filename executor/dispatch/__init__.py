"""Dispatch: the handler seam (the point of no return) and the reference forwarding handler."""
