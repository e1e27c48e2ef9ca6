"""The claims the report tests, in the report's order, and the papers they come from."""

import dataclasses
from typing import Callable

from . import accuracy_claims, other_claims, stragglar_claims, wagma_claims

__all__ = ["CLAIMS", "PAPERS", "Claim", "NOT_TESTED"]

#: The source papers (../shared/seeds), by key.
PAPERS = {
    "wagma": "WAGMA-SGD (Li, Ben-Nun, Nadiradze, Di Girolamo, Dryden, Alistarh, Hoefler; IEEE TPDS 2021)",
    "stragglar": "StragglAR (Devraj et al.)",
    "hierarchical": "Hierarchical SGD for straggler mitigation (PyTorch blog, Cruise + Meta)",
    "ddp": "PyTorch Distributed Data Parallel (Li et al., VLDB 2020)",
    "ensemblesync": "EnsembleSync (Xie and Yasunaga)",
}


@dataclasses.dataclass(frozen=True)
class Claim:
    """One testable claim.

    Args:
        name: what ``--only`` takes.
        paper: a key of :data:`PAPERS`.
        title: the claim's heading (the paper's section, figure or table).
        run: measures it: ``run(context) -> ClaimResult``.
        minutes: about how long ``run`` takes on 2 cores (the default, not ``--full``).
    """

    name: str
    paper: str
    title: str
    run: Callable
    minutes: float


CLAIMS = (
    Claim(
        "algorithm1",
        "wagma",
        "Algorithm 1: the worked example of the dynamic groups (section 3.2)",
        wagma_claims.algorithm1,
        0.2,
    ),
    Claim(
        "figure4",
        "wagma",
        "Figure 4: throughput under the simulated imbalance, measured (section 5.2)",
        wagma_claims.figure4_measured,
        13.3,
    ),
    Claim(
        "figure4-sim",
        "wagma",
        "Figure 4: throughput from 4 to 256 nodes, simulated (section 5.2)",
        wagma_claims.figure4_simulated,
        0.2,
    ),
    Claim(
        "figure10-sim",
        "wagma",
        "Figure 10: throughput from 16 to 1,024 nodes, simulated (section 5.4)",
        wagma_claims.figure10_simulated,
        0.2,
    ),
    Claim(
        "accuracy",
        "wagma",
        "Figure 5 and ablations 1-4: accuracy against time, measured over seeds (section 5.2)",
        accuracy_claims.accuracy,
        36.6,
    ),
    Claim(
        "accuracy-emulated",
        "wagma",
        "Figure 5 and ablations 1-4 at 16 and 64 ranks, emulated over seeds (section 5.2)",
        accuracy_claims.accuracy_emulated,
        28.1,
    ),
    Claim("stragglar-rounds", "stragglar", "Round counts of the schedules (section 3)", stragglar_claims.rounds, 0.1),
    Claim(
        "stragglar-cost",
        "stragglar",
        "Table 1 and Figure 6: the cost model's speedups, n = 4..256",
        stragglar_claims.cost_model,
        0.1,
    ),
    Claim(
        "stragglar-runtime",
        "stragglar",
        "Section 4.2: the runtime's speedup with a persistent straggler",
        stragglar_claims.runtime,
        0.3,
    ),
    Claim(
        "hierarchical",
        "hierarchical",
        "Straggler mitigation: 1-2 % of steps stall 1 s",
        other_claims.hierarchical_stragglers,
        2.1,
    ),
    Claim("ddp-buckets", "ddp", "Gradient bucketing and overlap with the backward pass", other_claims.ddp_buckets, 1.3),
    Claim(
        "ensemblesync",
        "ensemblesync",
        "Figure 4: training through a worker that stops",
        other_claims.ensemblesync_outage,
        1.5,
    ),
)

#: Claims of the papers this machine cannot test, and why (the report lists them).
NOT_TESTED = (
    (
        "wagma",
        "Figures 6-8: Transformer on WMT17 (BLEU 26.12 for WAGMA-SGD)",
        "needs the WMT17 data set (no download here) and GPU-days; the synthetic translation task "
        "(--dataset translation) exercises the same code path without a BLEU claim",
    ),
    (
        "wagma",
        "Figure 9-10 accuracy: PPO navigation in Habitat",
        "needs the Habitat simulator and its scenes; only its throughput (Figure 10) is simulated",
    ),
    ("wagma", "Theorem 1's convergence rate", "a proof, not a measurement"),
    (
        "stragglar",
        "Figure 9: Llama3.2-3B fine-tuning 7 s faster over 100 iterations",
        "needs 8 GPUs and the model; the in-training effect is measured by experiments.campaign stragglersync "
        "(results/stragglersync)",
    ),
    (
        "ensemblesync",
        "Table 2: 84.29 % on CIFAR-10 with ResNet-10, 6.6x faster than Async SGD",
        "needs CIFAR-10 (no download here) and the paper's parameter-server RPC set-up",
    ),
    ("ddp", "the VLDB paper's NCCL scaling figures", "need GPUs and NCCL"),
)
