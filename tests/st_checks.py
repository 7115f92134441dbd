"""Schemathesis hooks for tests/test_server_schemathesis.py (``SCHEMATHESIS_HOOKS=st_checks``).

One check, ``positive_data_acceptance_within_stated_rules``, stands in for schemathesis's
``positive_data_acceptance`` (excluded from the run): a schema-valid request must be accepted
(2xx, or 401/403/404/409/429 as the built-in check allows) unless it is refused with 400 by one
of the rules the OpenAPI document lists as the ones a JSON schema cannot state
(:data:`bucketsearch.app.openapi.SCHEMA_CANNOT_STATE`: they depend on the named index's bits,
on binary bodies, on the server's limits). Any other refusal of valid data fails, as before.
Each call appends a line to ``$ST_CHECKS_LOG`` so the test can see the check ran."""
from __future__ import annotations

import json
import os
import re

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

from bucketsearch.app.openapi import SCHEMA_CANNOT_STATE

STATED = re.compile("|".join(f"(?:{pattern})" for pattern, _ in SCHEMA_CANNOT_STATE))


def stated_refusal(response) -> str | None:
    """The detail of a 400 (or a 413: a batch over max_batch, which a binary body's schema
    cannot state) that names a rule of SCHEMA_CANNOT_STATE, else None."""
    if response.status_code not in (400, 413):
        return None
    try:
        detail = json.loads(response.text).get("detail")
    except (ValueError, AttributeError):
        return None
    if isinstance(detail, str) and STATED.search(detail):
        return detail
    return None


@schemathesis.check
def positive_data_acceptance_within_stated_rules(ctx, response, case):
    log = os.environ.get("ST_CHECKS_LOG")
    detail = stated_refusal(response)
    if log:
        with open(log, "a") as f:
            f.write(f"{case.operation.label}\t{response.status_code}\t"
                    f"{'stated' if detail else 'checked'}\n")
    if detail is not None:
        return None
    return positive_data_acceptance(ctx, response, case)
