"""HTTP routes (aiohttp): actions, control, approvals, plans and the door's HTTP adapter."""
