"""The banking family: canonical banking actions over the effect plane's adapter contract.

``actions.py`` is the profile's arithmetic and checks (ISO 4217 exponents from the ``iso4217``
package, IBANs and BICs by schwifty) and the projection; ``transport.py`` is the reference
core-banking transport (:class:`~agentsafe.executor.banking.transport.CoreBankingHttpAdapter`);
``registration.py`` registers every action this build mirrors (:func:`banking_handlers`). An
adopter with their own core replaces the transport and keeps the rest. Imports the effect plane,
the dispatch seam and egress; never the lifecycle, the routes or the process (import-linter).
"""
