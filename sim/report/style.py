"""One shared figure style for every tlora-sim plot (paper-style, one-column width).

What lives here:

* :data:`STYLE_RC` and :func:`style_context`: matplotlib settings readable at one-column width
  (:data:`COLUMN_WIDTH_IN` = 3.4 in, 7-8 pt text), TrueType fonts in PDFs (editable text, accepted by
  paper venues), no top/right spines, a light grid.
* The colour-blind-safe Okabe-Ito palette (:data:`OKABE_ITO`) and a fixed colour, line style, marker,
  hatch and order per policy (:func:`policy_order`, :func:`policy_styles`). The reference baseline
  ``independent-backfill`` comes first, in grey; the known policies
  ``independent, mlora, lorafusion, alto, tlora, lookahead`` always get the same colour (mLoRA orange,
  tLoRA blue) and follow in that order; any other name (``ours``, ablations like ``tlora-nogroup``) follows in alphabetical order and
  takes the remaining palette colours, so one set of policies always looks the same in every figure.
* The same for the kernel implementations and profiler plans (:func:`impl_order`, :func:`impl_styles`):
  ``base, alone, loop, padded, peft, fused`` in that order and fixed colours.
* :func:`axis_label` (every axis label carries a unit) and :func:`missing_units` (the check).
* :func:`save_figure`: writes a figure as vector PDF and PNG (200 dpi) atomically: a temp file in the
  target directory, then :func:`os.replace`; PDF metadata carries no date, so output is reproducible.

matplotlib is imported only inside functions and only through :class:`matplotlib.figure.Figure`
(never pyplot), so importing this module needs no display and never changes the global backend.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from tlora_sim.sim.runtime.atomic import atomic_write
from tlora_sim.traces.errors import InputError

#: One-column figure width of a two-column paper (inches).
COLUMN_WIDTH_IN = 3.4
#: Full text width of a two-column paper (inches).
DOUBLE_COLUMN_WIDTH_IN = 7.0
#: PNG resolution (dots per inch).
PNG_DPI = 200
#: Output formats :func:`save_figure` accepts.
SUPPORTED_FORMATS = ("png", "pdf", "svg")
#: Line width (pt) of data lines, passed explicitly: StepPatch (stairs) does not follow
#: ``lines.linewidth``.
LINE_WIDTH = 1.0
#: Seconds per hour and per day: the time axes are drawn in hours or days.
S_PER_H = 3600.0
S_PER_DAY = 86400.0

#: Okabe & Ito (2008) colour-blind-safe palette, by name.
OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}

#: Known policies, in the fixed order every figure and legend uses: the reference baseline first.
KNOWN_POLICIES = ("independent-backfill", "independent", "mlora", "lorafusion", "alto", "tlora", "lookahead")

#: The reference baseline's colour: neutral grey, so every other policy reads against it.
REFERENCE_GREY = "#8C8C8C"

#: Suffix of a policy's no-grouping ablation (``tlora_sim.policies.registry``): drawn in its base policy's
#: colour, dotted and with open hatching, right after the base policy.
ABLATION_SUFFIX = "-nogroup"

# mLoRA (orange) and tLoRA (blue) sit on opposite sides of the palette: never two similar hues.
_KNOWN_COLORS = {
    "independent-backfill": REFERENCE_GREY,
    "independent": OKABE_ITO["black"],
    "mlora": OKABE_ITO["orange"],
    "lorafusion": OKABE_ITO["sky_blue"],
    "alto": OKABE_ITO["bluish_green"],
    "tlora": OKABE_ITO["blue"],
    "lookahead": OKABE_ITO["reddish_purple"],
}
# Palette colours left for other policies, most legible on white first.
_EXTRA_COLORS = (OKABE_ITO["vermillion"], OKABE_ITO["yellow"], OKABE_ITO["sky_blue"])

_KNOWN_LINESTYLES = {
    "independent-backfill": (0, (1.0, 1.2)),  # dotted
    "independent": (0, (2.5, 1.5)),          # medium dash
    "mlora": (0, (4.0, 1.5)),                # dashed
    "lorafusion": (0, (4.0, 1.2, 1.0, 1.2)),  # dash-dot
    "alto": (0, (6.0, 1.2, 1.0, 1.2, 1.0, 1.2)),  # dash-dot-dot
    "tlora": (0, ()),                        # solid
    "lookahead": (0, (5.0, 1.0)),            # long dash
}
_EXTRA_LINESTYLES = (
    (0, (2.0, 1.0)),                  # short dash
    (0, (8.0, 2.0)),                  # long dash
    (0, (3.0, 1.0, 1.0, 1.0, 3.0, 3.0)),
    (0, (1.0, 2.5)),                  # loose dots
)
_KNOWN_MARKERS = {"independent-backfill": "o", "independent": "X", "mlora": "s", "lorafusion": "^", "alto": "D", "tlora": "*", "lookahead": "P"}
_EXTRA_MARKERS = ("v", "P", "X", "<", ">", "h")
_KNOWN_HATCHES = {"independent-backfill": "", "independent": "..", "mlora": "//", "lorafusion": "\\\\", "alto": "xx", "tlora": "",
                  "lookahead": "++"}
_EXTRA_HATCHES = ("..", "++", "oo", "--", "||")

#: matplotlib rc settings of the shared style (used through :func:`style_context`).
STYLE_RC = {
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "legend.handlelength": 2.4,
    "legend.columnspacing": 1.0,
    "legend.borderaxespad": 0.2,
    "axes.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.35,
    "lines.linewidth": 1.0,
    "lines.markersize": 3.5,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.minor.width": 0.4,
    "ytick.minor.width": 0.4,
    "xtick.major.size": 2.5,
    "ytick.major.size": 2.5,
    "xtick.minor.size": 1.5,
    "ytick.minor.size": 1.5,
    "hatch.linewidth": 0.5,
    "patch.linewidth": 0.4,
    "figure.dpi": 100,
    "savefig.dpi": PNG_DPI,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.fonttype": "none",
    "svg.hashsalt": "tlora-sim",
}


@dataclass(frozen=True)
class PolicyStyle:
    """How one policy is drawn.

    Attributes:
        name: policy name as it appears in the data.
        color: hex RGB colour (Okabe-Ito).
        linestyle: matplotlib dash tuple ``(offset, (on, off, ...))``; ``(0, ())`` is solid.
        marker: matplotlib marker code.
        hatch: bar hatch pattern ("" for none), so bars stay apart in greyscale print.
        order: position in legends and bar groups (0 first).
    """

    name: str
    color: str
    linestyle: tuple
    marker: str
    hatch: str
    order: int

    def line_kwargs(self) -> dict:
        """Keyword arguments for ``Axes.plot``/``Axes.stairs``: colour, line style, label."""
        return {"color": self.color, "linestyle": self.linestyle, "label": self.name}


def policy_order(policies: Iterable[str]) -> list[str]:
    """Return the distinct policy names in the fixed display order.

    Known policies (:data:`KNOWN_POLICIES`) come first in that order; any other name follows,
    sorted case-insensitively (ties by exact name), so the order never depends on input order.
    """
    names = list(dict.fromkeys(str(p) for p in policies))
    known = []
    for p in KNOWN_POLICIES:
        known += [q for q in (p, p + ABLATION_SUFFIX) if q in names]
    others = sorted((p for p in names if p not in known), key=lambda s: (s.lower(), s))
    return known + others


def policy_styles(policies: Iterable[str]) -> dict[str, PolicyStyle]:
    """Return a :class:`PolicyStyle` per policy, in :func:`policy_order` (dict order = display order).

    A known policy always gets the same colour, line style, marker and hatch whatever else is in the
    set. Other policies take, in their sorted order, the palette colours the known ones do not use
    (blue, reddish purple, yellow) and their own line styles; past three others the colours repeat
    with different line styles and markers, so every (colour, line style) pair stays distinct.
    Pass the same set of policies to get the same mapping (e.g. every figure of one comparison).
    """
    styles: dict[str, PolicyStyle] = {}
    extra = 0
    for i, name in enumerate(policy_order(policies)):
        base = name[: -len(ABLATION_SUFFIX)] if name.endswith(ABLATION_SUFFIX) else None
        if name in _KNOWN_COLORS:
            styles[name] = PolicyStyle(name, _KNOWN_COLORS[name], _KNOWN_LINESTYLES[name],
                                       _KNOWN_MARKERS[name], _KNOWN_HATCHES[name], i)
        elif base in _KNOWN_COLORS:
            styles[name] = PolicyStyle(name, _KNOWN_COLORS[base], (0, (1.0, 1.0)), _KNOWN_MARKERS[base], "....", i)
        else:
            styles[name] = PolicyStyle(
                name,
                _EXTRA_COLORS[extra % len(_EXTRA_COLORS)],
                _EXTRA_LINESTYLES[extra % len(_EXTRA_LINESTYLES)],
                _EXTRA_MARKERS[extra % len(_EXTRA_MARKERS)],
                _EXTRA_HATCHES[extra % len(_EXTRA_HATCHES)],
                i,
            )
            extra += 1
    return styles


#: Multi-LoRA implementations of the kernel benchmark / plans of the profiler, in display order.
KNOWN_IMPLS = ("base", "alone", "loop", "padded", "peft", "fused")

# base (the frozen layer, the reference) in neutral grey; the others echo the policy that runs them:
# alone ~ independent (black), loop ~ mLoRA (orange), fused ~ tLoRA/ours (vermillion).
_IMPL_COLORS = {"base": "#999999", "alone": OKABE_ITO["black"], "loop": OKABE_ITO["orange"],
                "padded": OKABE_ITO["sky_blue"], "peft": OKABE_ITO["reddish_purple"],
                "fused": OKABE_ITO["vermillion"]}
_IMPL_HATCHES = {"base": "", "alone": "", "loop": "//", "padded": "\\\\", "peft": "..", "fused": ""}
_IMPL_MARKERS = {"base": "s", "alone": "o", "loop": "s", "padded": "^", "peft": "v", "fused": "D"}
_EXTRA_IMPL_COLORS = (OKABE_ITO["blue"], OKABE_ITO["bluish_green"], OKABE_ITO["yellow"])


def impl_order(impls: Iterable[str]) -> list[str]:
    """Return the distinct implementation (or plan) names in display order.

    Known ones (:data:`KNOWN_IMPLS`) come first in that order, each followed by its variants
    (``fused#0``, ``fused#1``: one kernel configuration each, sorted); other names follow sorted.
    """
    names = list(dict.fromkeys(str(i) for i in impls))
    known = []
    for k in KNOWN_IMPLS:
        known += [n for n in names if n == k]
        known += sorted((n for n in names if n.startswith(k + "#")), key=lambda s: (len(s), s))
    return known + sorted((n for n in names if n not in known), key=lambda s: (s.lower(), s))


def impl_styles(impls: Iterable[str]) -> dict[str, PolicyStyle]:
    """Return a :class:`PolicyStyle` per implementation or plan name, in :func:`impl_order`.

    ``base`` (the frozen layer) is grey, ``alone`` black, ``loop`` orange, ``padded`` sky blue,
    ``peft`` reddish purple, ``fused`` vermillion, whatever else is in the set; a variant
    ``fused#k`` takes its implementation's colour with its own hatch and marker; other names take
    blue, bluish green and yellow in turn. Line styles are solid (these are bars and points).
    """
    styles: dict[str, PolicyStyle] = {}
    extra = 0
    variant = 0
    for i, name in enumerate(impl_order(impls)):
        root = name.split("#", 1)[0]
        if name in _IMPL_COLORS:
            styles[name] = PolicyStyle(name, _IMPL_COLORS[name], (0, ()), _IMPL_MARKERS[name],
                                       _IMPL_HATCHES[name], i)
        elif root in _IMPL_COLORS:
            styles[name] = PolicyStyle(name, _IMPL_COLORS[root], (0, ()),
                                       _EXTRA_MARKERS[variant % len(_EXTRA_MARKERS)],
                                       _EXTRA_HATCHES[variant % len(_EXTRA_HATCHES)], i)
            variant += 1
        else:
            styles[name] = PolicyStyle(name, _EXTRA_IMPL_COLORS[extra % len(_EXTRA_IMPL_COLORS)], (0, ()),
                                       _EXTRA_MARKERS[extra % len(_EXTRA_MARKERS)],
                                       _EXTRA_HATCHES[extra % len(_EXTRA_HATCHES)], i)
            extra += 1
    return styles


def axis_label(quantity: str, unit: str) -> str:
    """Return an axis label with its unit, ``"Quantity (unit)"``; every axis label goes through here.

    Dimensionless quantities still name what they count, e.g. ``axis_label("CDF", "fraction of jobs")``.
    """
    if not unit:
        raise ValueError(f"axis label {quantity!r} needs a unit")
    return f"{quantity} ({unit})"


_UNIT_RE = re.compile(r"\(.+\)\s*$")


def missing_units(fig) -> list[str]:
    """Return the non-empty axis labels of ``fig`` that do not end with a parenthesised unit."""
    bad = []
    for ax in fig.get_axes():
        if not ax.get_visible() or not ax.axison:
            continue
        for label in (ax.get_xlabel(), ax.get_ylabel()):
            if label and not _UNIT_RE.search(label):
                bad.append(label)
    return bad


@contextlib.contextmanager
def style_context() -> Iterator[None]:
    """Context manager applying :data:`STYLE_RC` plus the Okabe-Ito colour cycle, temporarily.

    Build and save figures inside it; the global rcParams are restored on exit.
    """
    import matplotlib as mpl
    from cycler import cycler

    rc = dict(STYLE_RC)
    rc["axes.prop_cycle"] = cycler(color=list(_KNOWN_COLORS.values()) + list(_EXTRA_COLORS))
    with mpl.rc_context(rc):
        yield


def legend_above(fig, ax, ncol_max: int = 3) -> None:
    """One legend for ``fig`` above its axes (``outside upper center``), from ``ax``'s labelled
    artists, in at most ``ncol_max`` columns; nothing when ``ax`` has no labelled artist."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncol=min(len(handles), ncol_max))


def new_figure(width_in: float = COLUMN_WIDTH_IN, height_in: float = 2.2):
    """Return a new :class:`matplotlib.figure.Figure` of the given size (inches), not tied to pyplot.

    Such a figure needs no display and is freed when dropped (nothing to close). Create it inside
    :func:`style_context` so it picks the shared style up.
    """
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def save_figure(fig, out_dir: str | os.PathLike, name: str, formats: Iterable[str] = ("png", "pdf"),
                *, dpi: int = PNG_DPI, check_units: bool = True) -> list[Path]:
    """Save ``fig`` as ``out_dir/name.<fmt>`` for each format, atomically; return the written paths.

    Each file is first written to a hidden temp file in ``out_dir`` and then renamed over the target
    (``runtime.atomic.atomic_write``), so a reader never sees a half-written figure. PNGs are ``dpi`` dots per
    inch (default 200); PDFs/SVGs are vector with embedded TrueType fonts and no creation date
    (reproducible bytes). The layout is computed once and then frozen (the figure's layout engine is
    set to "none"), so each file's bytes do not depend on the other formats saved. ``out_dir`` is
    created when missing.

    Raises:
        InputError: a format not in :data:`SUPPORTED_FORMATS` (field ``formats``), or a file that
            cannot be written (``runtime.write_errors``: one line naming it).
        ValueError: ``check_units`` and an axis label without a unit (a bug in the plotting code).
    """
    fmts = list(dict.fromkeys(str(f).lower().lstrip(".") for f in formats))
    for fmt in fmts:
        if fmt not in SUPPORTED_FORMATS:
            raise InputError(f"unsupported figure format {fmt!r}; expected some of "
                             f"{', '.join(SUPPORTED_FORMATS)}", field="formats")
    if check_units:
        bad = missing_units(fig)
        if bad:
            raise ValueError(f"figure {name!r}: axis labels without a unit: {bad}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Settle the layout once and freeze it: constrained layout re-run by each save starts from the
    # previous save's result, so a PDF's bytes would depend on which formats were saved before it.
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    written = []
    for fmt in fmts:
        target = out / f"{name}.{fmt}"
        metadata = {"CreationDate": None} if fmt == "pdf" else ({"Date": None} if fmt == "svg" else None)
        kwargs = {"format": fmt, "metadata": metadata}
        if fmt == "png":
            kwargs["dpi"] = dpi

        def write(tmp: Path, kwargs=kwargs) -> None:
            with open(tmp, "wb") as fh:
                fig.savefig(fh, **kwargs)

        written.append(atomic_write(target, write))
    return written


def run_figure_command(draw: Callable[[], Iterable[Path]], category: type[Warning]) -> int:
    """The shared tail of the figure commands (``python -m tlora_sim.sim.report.plots``, ``tlora_sim.profiler.figures``):
    run ``draw`` with each warning of ``category`` printed as one ``warning: ...`` line on stderr,
    then print the written paths.

    Returns:
        The exit status: 0, or 2 on an :class:`InputError` (printed as one ``error: ...`` line).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", category)
            warnings.showwarning = lambda message, *a, **k: print(f"warning: {message}", file=sys.stderr)
            paths = list(draw())
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


FOOTER_CHARS = 95
"""Most characters per footer line (a one-column figure at the footers' 4.5-5 pt)."""


def wrap_footer(parts: list[str], width: int = FOOTER_CHARS, sep: str = " | ") -> str:
    """``parts`` joined with ``sep`` into lines of at most ``width`` characters (a part longer than
    that gets a line of its own); every figure footer goes through here."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return "\n".join(lines)


def series_styles(names: Iterable[str]) -> dict[str, PolicyStyle]:
    """Styles of series named ``"<policy> <variant>"`` (a sweep's policy-option axes): each variant
    in its policy's colour (:func:`policy_styles`), told apart by hatch and line style; in
    :func:`policy_order` of the policies, variants in the order given."""
    names = list(dict.fromkeys(str(n) for n in names))
    base_of = {n: n.split(" ", 1)[0] for n in names}
    bases = policy_styles(base_of.values())
    hatches = ("", "//", "..", "xx", "\\\\", "++", "oo")
    out: dict[str, PolicyStyle] = {}
    i = 0
    for b, st in bases.items():
        for k, n in enumerate(x for x in names if base_of[x] == b):
            out[n] = PolicyStyle(n, st.color, st.linestyle if k == 0 else _EXTRA_LINESTYLES[k % len(_EXTRA_LINESTYLES)],
                                 st.marker, st.hatch if k == 0 else hatches[k % len(hatches)], i)
            i += 1
    return out
