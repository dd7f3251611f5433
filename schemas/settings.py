"""baton's settings, read from ``BATON_*`` environment variables. Each is declared once, typed.

Credentials are not here: boto3 reads the standard AWS_* variables and config files itself,
and a Redis password travels inside ``BATON_REDIS_URL`` (``rediss://`` for TLS).
"""
from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_STORAGE_URL = "file://./baton-data"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class BatonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATON_", extra="forbid")

    redis_url: str = Field(DEFAULT_REDIS_URL, description="Broker and job records (redis:// or rediss://).")
    storage_url: str = Field(DEFAULT_STORAGE_URL, description="Checkpoints and artifacts: s3://bucket/prefix or file:///path.")
    allowed_modules: str = Field(
        "", description="Comma-separated module prefixes whose callables a spec may name as targets (builtins always allowed)."
    )

    @field_validator("storage_url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if not url.startswith(("s3://", "file://")):
            raise ValueError(f"must start with s3:// or file:// (got {url!r})")
        return url

    @property
    def allowed_prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.allowed_modules.split(",") if p.strip())
