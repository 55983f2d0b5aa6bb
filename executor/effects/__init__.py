"""The effect plane: what an adapter observed a provider do, compared with what was authorised.

``adapter.py`` is the contract (prepare / execute / observe_effect / reconcile), the bridge that
makes any adapter a registry handler, the field-by-field comparison and the effect record;
``receipts.py`` verifies a provider's signed effect receipt (VP-3) against the keys registered
with the built-in authority. A family of actions (``agentsafe.executor.banking``) is a package
beside this one that imports it; nothing here imports a family.
"""
