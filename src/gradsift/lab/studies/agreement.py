"""Agreement with the authors' code: gradsift's SNIP and GraSP, as configured, against
transcriptions of the GraSP repository's ``GraSP()`` and of the Synaptic-Flow
repository's SNIP and GraSP (``gradsift.lab.baselines``), on a CIFAR ResNet-20 with
BatchNorm, in float64, on the same weights and batches: the cosine of the score
vectors and the Jaccard index of the kept sets at densities 10% and 1%.

It calls gradsift only through ``score``/``method_options``/``masks_from_scores``, so
that the same file measures an older gradsift too (an option that one does not have
is reported as n/a).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch

from gradsift import masks_from_scores, score
from gradsift.lab.baselines import reference_grasp, reference_grasp_batches, reference_snip
from gradsift.lab.data import loader, random_data
from gradsift.lab.models import build_model
from gradsift.lab.studies.common import machine
from gradsift.lab.tables import Column, render
from gradsift.pruning import class_balanced_sample, method_options

# model, input shape, classes, GraSP samples per class, SNIP batch size, the small
# sample's per class and chunk for the unequal-batches case (10 classes x 5 = 50 in 20s)
_FULL = ("resnet20", (3, 32, 32), 10, 25, 128, 5, 20)
_QUICK = ("resnet20", (3, 4, 4), 10, 2, 12, 2, 8)
DENSITIES = (0.1, 0.01)


def _ours(model, method, data, **options):
    """gradsift's scores and whether it warned; None where an option is unknown."""
    if not set(options) <= set(method_options(method)):
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = score(model, method, data, **options)
    return scores, any(issubclass(w.category, UserWarning) for w in caught)


def _negated(scores: dict) -> dict:
    return {n: -s for n, s in scores.items()}  # the GraSP paper's -θ ⊙ Hg, removed-highest


def _cases(model, setting):
    """``(references, cases)``: lazily computed reference scores by label, and the
    gradsift settings ``(label, reference label, method, options)`` compared to them."""
    _, shape, classes, per_class, batch, small, chunk = setting
    ds = random_data(shape, classes, per_class=per_class)
    data = [(x.double(), y) for x, y in loader(ds.train, batch_size=batch, shuffle=False)]
    x, y = class_balanced_sample(data, per_class, classes)
    xs, ys = class_balanced_sample(data, small, classes)
    parts = [(xs[i : i + chunk], ys[i : i + chunk]) for i in range(0, len(ys), chunk)]
    sizes = "/".join(str(len(p[1])) for p in parts)
    frozen = copy.deepcopy(model).eval()  # Synaptic-Flow's prune_loop default
    repo, sf_grasp = "GraSP repo", f"Synaptic-Flow GraSP, batches {sizes}"
    sf_snip = "Synaptic-Flow SNIP, every batch"
    references = {
        repo: lambda: _negated(reference_grasp(model, x, y)),
        repo + ", eval mode": lambda: _negated(reference_grasp(frozen, x, y)),
        sf_grasp: lambda: reference_grasp_batches(model, parts),
        "SNIP paper, 1 batch": lambda: reference_snip(model, data[:1]),
        sf_snip: lambda: reference_snip(model, data),
        "SNIP paper, 1 batch, eval mode": lambda: reference_snip(frozen, data[:1]),
    }
    grasp = {"samples_per_class": per_class, "num_classes": classes}
    tiny = {"samples_per_class": small, "num_classes": classes, "chunk_size": chunk}
    per_batch = {**tiny, "batch_weighting": "batch"}
    every = {"num_batches": None, "batch_weighting": "batch"}
    cases = [
        ("GraSP default", repo, "grasp", grasp),
        ("GraSP chunk_size=64", repo, "grasp", {**grasp, "chunk_size": 64}),
        (f"GraSP chunk_size={len(y) // 2}", repo, "grasp", {**grasp, "chunk_size": len(y) // 2}),
        ("GraSP default", repo + ", eval mode", "grasp", grasp),
        (f"GraSP chunks {sizes}", sf_grasp, "grasp", tiny),
        (f"GraSP chunks {sizes}, batch_weighting=batch", sf_grasp, "grasp", per_batch),
        ("SNIP default", "SNIP paper, 1 batch", "snip", {}),
        ("SNIP default", sf_snip, "snip", {}),
        ("SNIP num_batches=None", sf_snip, "snip", {"num_batches": None}),
        ("SNIP num_batches=None, batch_weighting=batch", sf_snip, "snip", every),
        ("SNIP default", "SNIP paper, 1 batch, eval mode", "snip", {}),
    ]  # fmt: skip
    return data, references, cases


def _compare(ours: dict, ref: dict) -> dict:
    a = torch.cat([ours[n].reshape(-1) for n in ref])
    b = torch.cat([ref[n].reshape(-1) for n in ref])
    row = {"cosine": float(a @ b / (a.norm() * b.norm()))}
    for d in DENSITIES:
        ma, mb = masks_from_scores(ours, 1 - d), masks_from_scores(ref, 1 - d)
        both = sum(int((ma[n] * mb[n]).sum()) for n in ref)
        either = sum(int(((ma[n] + mb[n]) > 0).sum()) for n in ref)
        row[f"jaccard_{d:g}"] = both / either
    return row


def agreement(out: Path, *, quick: bool = False):
    from gradsift.lab.plots import plot_bars

    setting = _QUICK if quick else _FULL
    torch.manual_seed(0)
    model = build_model(setting[0], input_shape=setting[1], num_classes=setting[2]).double()
    data, references, cases = _cases(model, setting)
    rows, refs = [], {}
    for label, ref_label, method, options in cases:
        if ref_label not in refs:
            refs[ref_label] = references[ref_label]()
        got = _ours(model, method, data, **options)
        row = {"gradsift": label, "reference": ref_label, "warned": None}
        if got is not None:
            row.update(_compare(got[0], refs[ref_label]), warned=got[1])
        rows.append(row)
    plot_bars(
        [str(i + 1) for i in range(len(rows))],
        [r.get("cosine", 0.0) for r in rows],
        out / "agreement.png",
        ylabel="cosine to the reference",
        title=f"{setting[0]} (BatchNorm), float64: rows of the table",
    )
    result = {"study": "agreement", "quick": quick, "setting": setting, "rows": rows}
    result["machine"] = machine()
    columns = [
        Column("gradsift", "gradsift"),
        Column("reference", "reference"),
        Column("cosine", "cosine", ".4f"),
        Column("jaccard_0.1", "Jaccard, 10% kept", ".3f"),
        Column("jaccard_0.01", "Jaccard, 1% kept", ".3f"),
        Column(lambda r: {None: "n/a", True: "yes", False: ""}[r["warned"]], "warned"),
    ]
    return result, render(rows, columns, markdown=True)
