"""Server settings: one pydantic-settings object, read from ``BUCKETSEARCH_*`` environment
variables (and the ``bucketsearch serve`` flags, which set the same fields)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    # hide_input_in_errors: a rejected key must not be echoed into a log
    model_config = SettingsConfigDict(env_prefix="BUCKETSEARCH_", extra="ignore",
                                      hide_input_in_errors=True)

    data_dir: Path = Field(Path("data"), description="directory holding one folder per index")
    api_key: SecretStr | None = Field(
        None, description="the write key: when set, writes need 'Authorization: Bearer <key>' "
                          "(it opens reads too)")
    read_key: SecretStr | None = Field(
        None, description="when set, reads need this key or the api_key; with read_key alone "
                          "nobody may write (fail closed)")
    max_body_bytes: int = Field(64 << 20, ge=1024, description="request body limit (413 beyond)")
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600,
        description="seconds a request body may take to arrive in full (408 beyond)")
    max_concurrent_requests: int = Field(
        64, ge=1, description="requests in flight (503 + Retry-After beyond; /healthz, "
                              "/readyz and /metrics are not counted)")
    max_batch: int = Field(100_000, ge=1, description="codes or ids per request")
    max_k: int = Field(10_000, ge=1, description="largest k of a k-NN search")
    max_results: int = Field(5_000_000, ge=1,
                             description="largest total number of ids one search may return")
    max_probes: int = Field(10_000_000, ge=1,
                            description="probe guard of single-table searches (per query)")
    max_request_probes: int = Field(
        500_000_000, ge=1, description="probe budget of one search request (all its queries)")
    max_request_compares: int = Field(
        20_000_000_000, ge=1, description="codes one request may compare by linear scans (the "
                                          "scan plan: queries x items; the delta: queries x "
                                          "delta items)")
    max_request_memory: int = Field(
        1 << 30, ge=1 << 20, description="bytes of answer and statistics one request may hold, "
                                         "estimated from what it asks before any work "
                                         "(index/budget.py)")
    max_evaluate_pairs: int = Field(
        2_000_000_000, ge=1, description="queries x database items of one evaluate request")
    advise_max_queries: int = Field(
        2_000, ge=1, description="queries of one radius-advisor request (sample, query_ids or "
                                 "codes; 400 beyond)")
    advise_max_radius: int = Field(
        16, ge=0, le=256, description="largest radius_max of a radius-advisor request (each "
                                      "radius is one timed search of the sample; 400 beyond)")
    audit_rate: float = Field(
        0.01, ge=0.0, le=1.0, description="exactness audit: share of answered searches whose "
                                          "answers are re-checked by a linear scan of the same "
                                          "state, off the request path (0: off)")
    audit_queries: int = Field(
        4, ge=1, le=1024, description="exactness audit: queries of one sampled request "
                                      "re-checked (chosen at random)")
    audit_queue: int = Field(
        64, ge=1, le=65_536, description="exactness audit: sampled answers waiting for the "
                                         "checker (dropped and counted beyond)")
    audit_cpu_share: float = Field(
        0.01, gt=0.0, le=1.0, description="exactness audit: the checker's CPU as a share of the "
                                          "CPU spent serving, and of one core (it waits after "
                                          "each check to keep to it)")
    audit_keep: int = Field(
        20, ge=1, le=10_000, description="exactness audit: mismatches kept for GET /v1/audit")
    max_indexes: int = Field(1_000, ge=1, description="indexes one server holds (409 beyond)")
    merge_threshold: int = Field(50_000, ge=1,
                                 description="delta items or tombstones that trigger a merge")
    read_only: bool = Field(False, description="refuse writes (set for several workers)")
    mmap: bool = Field(False, description="memory-map snapshot arrays (shared between workers)")
    follow_interval_s: float = Field(
        0.2, gt=0, le=60, description="read-only servers: seconds between two catch-ups with "
                                      "the writer's log (new writes, merges, new and deleted "
                                      "indexes)")
    cost_history_interval_s: float = Field(
        30.0, gt=0, le=3600, description="seconds between two saves of each index's cost "
                                         "figures (cost-history.json; also saved at a clean "
                                         "stop): a killed server loses at most this much")
    shards: int = Field(
        0, ge=0, le=1024, description="serve --shards N: new indexes are split over N shard "
                                      "actors on Ray (0: one in-process index; index/cluster/)")
    ray_address: str | None = Field(
        None, description="serve --ray-address: the Ray cluster of the shard actors (unset: a "
                          "local Ray is started)")
    shard_replicas: int = Field(
        0, ge=0, le=16, description="sharded indexes: read replicas per shard (actors following "
                                    "the shard's log; searches alternate between the primary and "
                                    "its replicas, staleness up to follow_interval_s)")
    jobs_per_index: int = Field(1, ge=1, le=64, description="near-duplicate jobs (POST "
                                "/v1/jobs) running at a time per index (409 beyond)")
    job_max_result_bytes: int = Field(
        16 << 30, ge=1, description="largest result file of a job (pairs: 20 bytes each); a "
                                    "job whose result passes it fails with that reason")
    warmup: bool = Field(True, description="compile and warm every search path before ready")
    calibration_queries: int = Field(
        64, ge=0, description="sampled queries of the t0 calibration run at startup per index")
    calibration_radius: int = Field(2, ge=0, le=256)

    @field_validator("api_key", "read_key")
    @classmethod
    def _usable_key(cls, key: SecretStr | None) -> SecretStr | None:
        """An empty key, or one with whitespace, could never be sent as a Bearer token: refuse
        to start rather than lock everyone out (or in) silently."""
        if key is not None and (not key.get_secret_value()
                                or any(c.isspace() for c in key.get_secret_value())):
            raise ValueError("an API key must be non-empty and without whitespace; unset the "
                             "variable to run without a key")
        return key


ENV_PREFIX = "BUCKETSEARCH_"
#: BUCKETSEARCH_* variables read outside Settings, by the engine.
OTHER_ENV_VARS = {"BUCKETSEARCH_THREADS": "threads of batch searches (index._jit)"}

log = logging.getLogger("bucketsearch.app")


def known_env_vars() -> list[str]:
    """Every BUCKETSEARCH_* variable something reads."""
    return sorted([ENV_PREFIX + name.upper() for name in Settings.model_fields]
                  + list(OTHER_ENV_VARS))


def unknown_env_vars(environ=None) -> list[str]:
    """BUCKETSEARCH_* variables nothing reads (a typo sets nothing, silently, otherwise).
    Names compare case-insensitively, as pydantic-settings reads them."""
    environ = os.environ if environ is None else environ
    known = set(known_env_vars())
    return sorted(name for name in environ
                  if name.upper().startswith(ENV_PREFIX) and name.upper() not in known)


def unknown_env_warning(environ=None) -> str | None:
    """The startup warning naming each unknown variable (never its value), or None."""
    unknown = unknown_env_vars(environ)
    if not unknown:
        return None
    return (f"unknown environment variable{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)} (ignored); the known ones are {', '.join(known_env_vars())}")


_reported: set[tuple[str, ...]] = set()  # one warning per process (serve, then create_app)


def warn_unknown_env(environ=None, emit=log.warning) -> str | None:
    """``emit`` :func:`unknown_env_warning` once per process and set of names; returns it."""
    warning = unknown_env_warning(environ)
    key = tuple(unknown_env_vars(environ))
    if warning is not None and key not in _reported:
        _reported.add(key)
        emit(warning)
    return warning
