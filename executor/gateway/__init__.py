"""The gateway: HTTP interception in front of an upstream (``agentsafe proxy``); every write is an
intent, decided, and forwarded byte for byte only on ALLOW, once, under a claimed grant."""
