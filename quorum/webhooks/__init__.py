"""quorum-webhooks: the stateless aiohttp admission server (pure policies, one patch builder)."""
