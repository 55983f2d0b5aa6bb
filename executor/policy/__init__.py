"""Policy: the policy document, CEL rules, the built-in authority and its claim attestations."""
