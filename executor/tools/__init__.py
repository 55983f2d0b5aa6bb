"""Developer and operator tools that never run inside ``agentsafe serve``: the demo, the
synthetic provider, the harness, the approvals client and the intent verifier.
"""
