"""The door: who is calling (bearer, workload token, client certificate), and may they call."""
