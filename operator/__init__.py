"""agentsafe.operator: reconciles AgentPolicy, Principal and HaltSwitch resources into executors.

Runs as its own process (``agentsafe operator``), never inside the executor's event loop. It imports
the executor's configuration and policy models so that what it renders is what the executor loads.
"""
