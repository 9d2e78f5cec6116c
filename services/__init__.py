"""Hops services: each a pure core plus, later, a thin asyncio shell."""
