"""Server settings: one pydantic-settings object, read from ``BUCKETSEARCH_*`` environment
variables (and the ``bucketsearch serve`` flags, which set the same fields)."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BUCKETSEARCH_", extra="ignore")

    data_dir: Path = Field(Path("data"), description="directory holding one folder per index")
    api_key: SecretStr | None = Field(
        None, description="when set, mutating endpoints need 'Authorization: Bearer <key>'")
    read_key: SecretStr | None = Field(
        None, description="when set, read endpoints need this key (or the api_key) too")
    max_body_bytes: int = Field(64 << 20, ge=1024, description="request body limit (413 beyond)")
    max_batch: int = Field(100_000, ge=1, description="codes or ids per request")
    max_k: int = Field(10_000, ge=1, description="largest k of a k-NN search")
    max_results: int = Field(5_000_000, ge=1,
                             description="largest total number of ids one search may return")
    max_probes: int = Field(10_000_000, ge=1,
                            description="probe guard of single-table searches (per query)")
    max_request_probes: int = Field(
        500_000_000, ge=1, description="probe budget of one search request (all its queries)")
    max_evaluate_pairs: int = Field(
        2_000_000_000, ge=1, description="queries x database items of one evaluate request")
    merge_threshold: int = Field(50_000, ge=1,
                                 description="delta items or tombstones that trigger a merge")
    read_only: bool = Field(False, description="refuse writes (set for several workers)")
    mmap: bool = Field(False, description="memory-map snapshot arrays (shared between workers)")
    warmup: bool = Field(True, description="compile and warm every search path before ready")
    calibration_queries: int = Field(
        64, ge=0, description="sampled queries of the t0 calibration run at startup per index")
    calibration_radius: int = Field(2, ge=0, le=256)
