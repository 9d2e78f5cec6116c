"""The registry's spec types: a policy's name and typed settings, one msgspec
struct tagged with the name (see :mod:`scheduling.registry`).

A cluster spec extends its policy's own settings
(:class:`~scheduling.policies.hops.policy.HopsSettings`,
:class:`~scheduling.policies.sia.policy.SiaSettings`,
:class:`~scheduling.policies.gavel.policy.GavelSettings`), so every setting
keeps the one definition and default of its policy; a task spec names a
task-level policy (hare.md), Hare's extending
:class:`~.hare.policy.HareSettings`. A policy defined outside the registry
subclasses :class:`ExtensionSpec` and is added with
:func:`~.grammar.register`. The tenant and core specs, which name the
cluster policy they wrap in spec text (``inner``), are the grammar's
(:mod:`.grammar`); the policies' names of every kind are here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from scheduling.cells import CellModel
from scheduling.layers.traits import PolicyTraits
from scheduling.policies.gavel.policy import GavelSettings
from scheduling.policies.hare.policy import HareSettings
from scheduling.policies.hops.policy import HopsSettings
from scheduling.policies.sia.policy import SiaSettings
from scheduling.policies.slurm.policy import SlurmSettings
from scheduling.policies.themis.policy import ThemisSettings
from scheduling.policies.tiresias.policy import TiresiasSettings
from scheduling.policy import Policy
from shared.job import R_NUM

DEFAULT_INNER = "hops"


class HopsSpec(HopsSettings, tag="hops", tag_field="name", frozen=True):
    """The paper's scheduler (:class:`scheduling.policies.hops.policy.HopsPolicy`)."""


class HopsProfilePreemptSpec(
    HopsSettings, tag="hops-profile-preempt", tag_field="name", frozen=True
):
    """Hops whose profiling may take a running job's GPU at a round boundary
    (the paper's profiling-first, §3.2; ``HopsSettings.profile_preempt``)."""

    profile_preempt: bool = True


class HopsPaperSpec(HopsSettings, tag="hops-paper", tag_field="name", frozen=True):
    """Hops as the paper states it: no reconfiguration cost, every running
    job replanned at a first plan without hysteresis, the fill plans' window
    over every waiting job, and every pass proven to the 1% gap of §4.7
    (docs/baselines.md, "Hops variants")."""

    reconfig_cost: float | None = 0.0
    fill_filter: bool = False
    accept_gap: float = 0.01
    preempt_exempt: float = 0.0
    profile_reuse: bool = False  # one record per job (§3.3)
    preempt_margin: float = 0.0
    priority: str = "lr"  # Eq. (8)
    move_min_gain: float = 0.0
    keep_in_place_partial: bool = False


class SiaSpec(SiaSettings, tag="sia", tag_field="name", frozen=True):
    """The Sia baseline (:class:`scheduling.policies.sia.policy.SiaPolicy`)."""


class SiaLpStartSpec(SiaSettings, tag="sia-lp-start", tag_field="name", frozen=True):
    """Sia with the LP optimum rounded down as its ILP's start
    (``SiaSettings.start``), for comparing solve times."""

    start: str = "rounded-lp"


class SiaEstimatorSpec(SiaSettings, tag="sia-estimator", tag_field="name", frozen=True):
    """Sia given Hops' estimator's curves instead of its own bootstrapped
    model (``SiaSettings.throughput``): better information than its paper's."""

    throughput: str = "estimator"


class GavelSpec(GavelSettings, tag="gavel", tag_field="name", frozen=True):
    """The Gavel baseline (:class:`scheduling.policies.gavel.policy.GavelPolicy`)."""


class SlurmSpec(SlurmSettings, tag="slurm", tag_field="name", frozen=True):
    """The Slurm-style baseline: multifactor priority with EASY backfill
    (:class:`scheduling.policies.slurm.policy.SlurmPolicy`)."""


class TiresiasSpec(TiresiasSettings, tag="tiresias", tag_field="name", frozen=True):
    """The Tiresias baseline: discretised 2D-LAS
    (:class:`scheduling.policies.tiresias.policy.TiresiasPolicy`)."""


class ThemisSpec(ThemisSettings, tag="themis", tag_field="name", frozen=True):
    """The Themis baseline: finish-time fairness by partial-allocation auction
    (:class:`scheduling.policies.themis.policy.ThemisPolicy`)."""


ClusterSpec = (HopsSpec | HopsProfilePreemptSpec | HopsPaperSpec | SiaSpec | SiaLpStartSpec
               | SiaEstimatorSpec | GavelSpec | SlurmSpec | TiresiasSpec | ThemisSpec)
CLUSTER_TYPES = (HopsSpec, HopsProfilePreemptSpec, HopsPaperSpec, SiaSpec, SiaLpStartSpec,
                 SiaEstimatorSpec, GavelSpec, SlurmSpec, TiresiasSpec, ThemisSpec)
# The cluster policies that order their queue by their own rule, with no
# ``priority`` setting (Slurm's multifactor priority, Tiresias' queues,
# Themis' finish-time fairness).
ORDERED_OWN_WAY = (SlurmSpec, TiresiasSpec, ThemisSpec)
# Every cluster policy's settings (what the profiling-first layer reads).
ClusterSettings = (HopsSettings | SiaSettings | GavelSettings | SlurmSettings | TiresiasSettings
                   | ThemisSettings)


# The cluster policies (every one runs without tenants' cells); the tenant
# policies need cells.
POLICIES: tuple[str, ...] = ("hops", "hops-profile-preempt", "hops-paper", "sia",
                             "sia-lp-start", "sia-estimator", "gavel", "slurm", "tiresias",
                             "themis")
TENANT_POLICIES: tuple[str, ...] = ("hived", "quota", "quota-borrow")
# The core policies: CPU cores scheduled beside the GPUs (issue 21).
CORE_POLICIES: tuple[str, ...] = ("coda", "fifo", "drf", "fixed-cores")
DEFAULT_POLICY = "hops"
# The task-level policies (hare.md): Hare and the baselines of §7.1.
TASK_POLICIES: tuple[str, ...] = ("hare", "hare-eft", "gavel-fifo", "srtf", "homo", "allox")


class PolicyError(ValueError):
    """A spec that names no policy, or a setting its policy does not take."""


# --- task-level policies (issue 23, hare.md) ---------------------------------------------


class HareSpec(HareSettings, tag="hare", tag_field="name", frozen=True):
    """Hare (hare.md, Algorithm 1): line 12 places a task on the GPU free
    earliest; ``ties=order`` breaks its ties by GPU order."""


class HareEftSpec(HareSettings, tag="hare-eft", tag_field="name", frozen=True):
    """Hare placing each task where it would finish earliest."""

    placement: Literal["earliest-free", "earliest-finish"] = "earliest-finish"


class _Bare(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A baseline of hare.md §7.1 without settings."""


class GavelFifoSpec(_Bare, tag="gavel-fifo", tag_field="name", frozen=True):
    """Gavel's heterogeneity-aware FIFO, per task."""


class SrtfSpec(_Bare, tag="srtf", tag_field="name", frozen=True):
    """Shortest remaining time first."""


class HomoSpec(_Bare, tag="homo", tag_field="name", frozen=True):
    """A heterogeneity-blind scheduler."""


class AlloxSpec(_Bare, tag="allox", tag_field="name", frozen=True):
    """AlloX's min-cost matching."""


TaskSpec = HareSpec | HareEftSpec | GavelFifoSpec | SrtfSpec | HomoSpec | AlloxSpec
TASK_TYPES = (HareSpec, HareEftSpec, GavelFifoSpec, SrtfSpec, HomoSpec, AlloxSpec)
TASK_SPECS: Mapping[str, type[TaskSpec]] = {
    str(cls.__struct_config__.tag): cls for cls in TASK_TYPES}
assert tuple(TASK_SPECS) == TASK_POLICIES, "every task policy has its spec"


# --- policies registered from outside ----------------------------------------------------


class ExtensionSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A policy defined outside the registry (a test's, a site's own): a
    subclass tagged with its name (``tag="...", tag_field="name"``) builds
    its policy and answers the traits of the layers it stacks, from its
    settings alone. :func:`register` makes every entry point take it."""

    def build(self, cells: CellModel | None) -> Policy:
        """The policy, inside its layers."""
        raise NotImplementedError

    def layer_traits(self) -> tuple[PolicyTraits, ...]:
        """The traits of the layer classes its policy stacks."""
        return ()

    @property
    def r_num(self) -> int:
        """R_num of the policy it builds (what admission and the mechanism read)."""
        return R_NUM
