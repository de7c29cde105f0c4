"""Forges (GitHub, GitLab): approval evidence that only the forge has, behind one small interface.

- `Forge.reviews(number, head)`: the reviews of a merged pull request (`reviews.PullReviews`);
  adapters: `github.GitHubForge` (REST through githubkit), `gitlab.GitLabForge`.
- `webflow`: GitHub's web-flow OpenPGP keys (shipped as package data) for verifying the
  merges GitHub signs.
- `webhook`: checking a delivery (HMAC or token, replays, staleness) before it wakes the watcher.
"""

from ledger.forge.reviews import PullReviews, Review, ReviewLookup

__all__ = ["PullReviews", "Review", "ReviewLookup"]
