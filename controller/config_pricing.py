"""The config's ``[pricing]`` table: :class:`PricingConfig` and its reader, with the
prior it names (``"default"``, ``"none"`` or a JSON file of ``oasis calibrate``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from controller.config_file import ConfigError
from controller.config_keys import _check_keys
from controller.files import read_bounded
from pricing import fields
from pricing.bound_estimate import DEFAULT_TRIM
from pricing.bound_prior import MAX_PRIOR_BYTES, Prior, prior_from_dict
from pricing.cluster import Cluster
from pricing.default_prior import default_prior
from pricing.errors import SpecError
from pricing.prices import PriceBounds, bounds_from_dict

__all__ = ["PricingConfig"]


@dataclass(frozen=True)
class PricingConfig:
    """How the daemon gets its price bounds.

    Attributes:
        mode: ``"explicit"`` (``bounds`` given) or ``"estimate"`` (from the jobs seen).
        bounds: explicit bounds, for ``mode == "explicit"``.
        trim: estimate: L ignores the jobs of lowest unit value that carry this share of
            the utility seen, in [0, 1) (pricing/bound_estimate.py).
        l_margin: estimate: the estimated L is multiplied by this, in (0, 1].
        u_margin: estimate: the estimated U is multiplied by this, >= 1.
        prior: estimate: the prior it starts from (pricing/bound_prior.py); None: none,
            the first job sets it. The config's ``prior`` is ``"default"`` (the shipped
            :func:`pricing.default_prior.default_prior`, also when absent), ``"none"``,
            or the path of a JSON prior ``oasis calibrate`` wrote.
    """

    mode: str
    bounds: PriceBounds | None = None
    l_margin: float = 1.0
    u_margin: float = 1.0
    trim: float = DEFAULT_TRIM
    prior: Prior | None = field(default_factory=default_prior)


def _prior(raw: Any, base: Path | None) -> Prior | None:
    """``pricing.prior``: ``"default"``, ``"none"`` or the path of a JSON prior, relative
    to ``base`` (the config file's folder) if given, else to the working directory."""
    name = fields.text(raw, "pricing.prior")
    if name == "default":
        return default_prior()
    if name == "none":
        return None
    path = Path(name)
    if base is not None and not path.is_absolute():
        path = base / path
    try:
        data = read_bounded(path, MAX_PRIOR_BYTES)
    except OSError as err:
        raise ConfigError(f"pricing.prior: cannot read {path}: {err.strerror or err}") from err
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ConfigError(f"pricing.prior: {path} is not JSON: {err}") from err
    try:
        prior = prior_from_dict(doc, "prior")
    except SpecError as err:
        raise ConfigError(
            f"pricing.prior: {path} is not a prior of oasis calibrate: {err}"
        ) from err
    return prior if prior.source else replace(prior, source=str(path))


def _pricing(raw: Mapping[str, Any], cluster: Cluster, base: Path | None = None) -> PricingConfig:
    mode = raw.get("bounds", "estimate")
    if mode == "estimate":
        _check_keys(raw, {"bounds", "l_margin", "u_margin", "trim", "prior"}, "pricing")
        l_margin = fields.positive(raw.get("l_margin", 1.0), "pricing.l_margin")
        u_margin = fields.positive(raw.get("u_margin", 1.0), "pricing.u_margin")
        if l_margin > 1:
            raise ConfigError("pricing.l_margin: must be in (0, 1]")
        if u_margin < 1:
            raise ConfigError("pricing.u_margin: must be >= 1")
        trim = fields.number(raw.get("trim", DEFAULT_TRIM), "pricing.trim")
        if not 0 <= trim < 1:
            raise ConfigError(f"pricing.trim: must be in [0, 1), got {trim}")
        prior = _prior(raw.get("prior", "default"), base)
        return PricingConfig("estimate", None, l_margin, u_margin, trim, prior)
    if mode == "explicit":
        for key in ("trim", "l_margin", "u_margin", "prior"):  # the estimate's keys
            if key in raw:
                raise ConfigError(
                    f'pricing.{key}: only with bounds = "estimate"; with "explicit" '
                    "bounds remove it (the keys are U1, U2, L1, L2)"
                )
        _check_keys(raw, {"bounds", "U1", "U2", "L1", "L2"}, "pricing")
        explicit = {k: v for k, v in raw.items() if k != "bounds"}
        bounds = bounds_from_dict(explicit, cluster, "pricing")
        assert bounds is not None
        return PricingConfig("explicit", bounds, prior=None)
    raise ConfigError(f"pricing.bounds: must be 'estimate' or 'explicit', got {mode!r}")
