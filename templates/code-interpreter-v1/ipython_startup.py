"""Airlock's IPython kernel start-up (template code-interpreter-v1).

Every Python kernel runs this file at start (`--IPKernelApp.exec_files`). It adds what E2B's
code interpreter adds to Jupyter's display outputs, so that `e2b_code_interpreter` sees the
same results:

* matplotlib draws with the inline backend: figures left open at the end of a cell come back as
  a `display_data` with `image/png`, without `plt.show()` or `savefig`;
* a matplotlib `Figure` also gets `e2b/chart`: its data as the dict the SDK's
  `charts._deserialize_chart` reads (line, scatter, bar, pie, box_and_whisker, superchart,
  unknown);
* a pandas `DataFrame` also gets `e2b/data`: `{column: [values]}`, like
  `df.to_dict(orient="list")`, made JSON-safe.

It prints nothing, imports neither pandas nor matplotlib (it looks for them in `sys.modules` at
display time), leaves no names in the user's namespace, and a figure or frame it cannot read only
loses its extra MIME type: it never breaks the PNG, the HTML or the text.
"""


def _airlock_startup():
    import datetime
    import math
    import numbers
    import os
    import re
    import sys
    import warnings

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    shell = get_ipython()
    if shell is None:
        return

    # ipykernel picks the inline backend only when MPLBACKEND is unset; a non-interactive
    # fallback inherited from the environment would otherwise swallow every figure.
    inline = "module://matplotlib_inline.backend_inline"
    if os.environ.get("MPLBACKEND", "").strip().lower() in ("", "agg"):
        os.environ["MPLBACKEND"] = inline

    # `e2b/data` is skipped above this many cells: the whole frame travels in the message.
    max_data_cells = 1_000_000
    unit_re = re.compile(r"\s\((.*?)\)|\[(.*?)\]")

    # ---- JSON-safe values -------------------------------------------------------------------

    def value(v):
        """A JSON-safe scalar: numbers as float (NaN/inf as None), dates as ISO strings."""
        if v is None or isinstance(v, str):
            return v
        np = sys.modules.get("numpy")
        if np is not None and isinstance(v, np.datetime64):
            if np.isnat(v):
                return None
            return str(v.astype("datetime64[s]"))
        if isinstance(v, (datetime.date, datetime.time)):
            if v != v:  # pandas.NaT is a datetime that is not equal to itself
                return None
            return v.isoformat()
        if isinstance(v, numbers.Real):
            f = float(v)
            return f if math.isfinite(f) else None
        return str(v)

    def cell(v):
        """A JSON-safe DataFrame cell: like `value`, but ints and bools keep their type and
        containers are cleaned recursively."""
        if v is None or isinstance(v, (str, bool)):
            return v
        if isinstance(v, numbers.Integral):
            return int(v)
        if isinstance(v, dict):
            return {str(k): cell(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [cell(x) for x in v]
        np = sys.modules.get("numpy")
        if np is not None:
            if isinstance(v, np.bool_):
                return bool(v)
            if isinstance(v, np.ndarray):
                return [cell(x) for x in v.tolist()]
        pd = sys.modules.get("pandas")
        if pd is not None:
            if v is pd.NA or v is pd.NaT:
                return None
            if isinstance(v, pd.Timedelta):
                return str(v)
        return value(v)

    # ---- e2b/data -----------------------------------------------------------------------------

    def frame_data(df):
        if df.size > max_data_cells:
            return None
        with warnings.catch_warnings():
            # Duplicate column names warn (and collapse); the HTML still shows them all.
            warnings.simplefilter("ignore")
            columns = df.to_dict(orient="list")
        return {
            (k if isinstance(k, str) else str(k)): [cell(v) for v in vs]
            for k, vs in columns.items()
        }

    # ---- e2b/chart ----------------------------------------------------------------------------

    # Everything below runs only for a Figure, so matplotlib is loaded by then.

    def text_or_none(s):
        return s if s else None

    def axes_title(ax):
        for loc in ("center", "left", "right"):
            t = ax.get_title(loc=loc)
            if t:
                return t
        return None

    def children(ax):
        kids = getattr(ax, "_children", None)
        if kids is None:
            kids = [
                *ax.lines,
                *ax.collections,
                *ax.patches,
                *ax.images,
                *ax.texts,
                *ax.tables,
                *ax.artists,
            ]
        from matplotlib.text import Text

        return [k for k in kids if not isinstance(k, Text)]

    def is_straight_segment(line):
        """Two points on a horizontal or vertical line: axhline/axvline, error bars, whiskers."""
        x, y = line.get_xdata(), line.get_ydata()
        if len(x) != 2 or len(y) != 2:
            return False
        try:
            return bool(x[0] == x[1] or y[0] == y[1])
        except Exception:
            return False

    def box_outline(line):
        """[x0, x1, y0, y1] of a box that `boxplot` drew as a closed rectangle of lines (its
        default, without `patch_artist`), else None."""
        x, y = line.get_xdata(), line.get_ydata()
        if len(x) != 5 or len(y) != 5:
            return None
        try:
            xs, ys = [float(v) for v in x], [float(v) for v in y]
        except Exception:
            return None
        if (xs[0], ys[0]) != (xs[4], ys[4]) or len(set(xs)) != 2 or len(set(ys)) != 2:
            return None
        return [min(xs), max(xs), min(ys), max(ys)]

    def chart_type(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.lines import Line2D
        from matplotlib.patches import PathPatch, Rectangle, Wedge

        objs = children(ax)
        if not objs:
            return None
        if all(isinstance(o, Line2D) for o in objs):
            return "box_and_whisker" if any(box_outline(o) for o in objs) else "line"
        if all(isinstance(o, (PathPatch, Line2D)) for o in objs):
            return "box_and_whisker"
        objs = [o for o in objs if not (isinstance(o, Line2D) and is_straight_segment(o))]
        if objs and all(isinstance(o, PathCollection) for o in objs):
            return "scatter"
        if objs and all(isinstance(o, Wedge) for o in objs):
            return "pie"
        if objs and all(isinstance(o, Rectangle) for o in objs):
            return "bar"
        return "unknown"

    def converter(axis):
        get = getattr(axis, "get_converter", None)
        return get() if get is not None else getattr(axis, "converter", None)

    def is_date_axis(axis):
        import matplotlib.dates as mdates

        kinds = tuple(
            c
            for c in (
                getattr(mdates, n, None)
                for n in ("DateConverter", "ConciseDateConverter", "_SwitchableDateConverter")
            )
            if isinstance(c, type)
        )
        return bool(kinds) and isinstance(converter(axis), kinds)

    def is_category_axis(axis):
        from matplotlib.category import StrCategoryConverter

        return isinstance(converter(axis), StrCategoryConverter)

    def scale(axis):
        if is_date_axis(axis):
            return "datetime"
        s = axis.get_scale()
        if s != "linear":
            return s
        return "categorical" if is_category_axis(axis) else "linear"

    def ticks(axis):
        locs = list(axis.get_ticklocs())
        labels = [t.get_text() for t in axis.get_ticklabels()]
        if is_date_axis(axis):
            import matplotlib.dates as mdates

            return [mdates.num2date(t).isoformat() for t in locs], labels
        return [value(t) for t in locs], labels

    def axis_label(ax, which):
        return text_or_none(ax.get_xlabel() if which == "x" else ax.get_ylabel())

    def unit(label):
        if not label:
            return None
        m = unit_re.search(label)
        return (m.group(1) or m.group(2)) if m else None

    def chart_2d(ax, kind, swap=False):
        x_label, y_label = axis_label(ax, "x"), axis_label(ax, "y")
        if swap:
            x_label, y_label = y_label, x_label
        return {
            "type": kind,
            "title": axes_title(ax),
            "x_label": x_label,
            "y_label": y_label,
            "x_unit": unit(x_label),
            "y_unit": unit(y_label),
            "elements": [],
        }

    def auto_label(label, prefix, name):
        if label.startswith(prefix):
            n = label[len(prefix) :]
            return f"{name} {n}" if n.isdigit() else name
        return label

    def point_chart(ax, kind):
        c = chart_2d(ax, kind)
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            t, labels = ticks(axis)
            c[f"{which}_ticks"] = t
            c[f"{which}_tick_labels"] = labels
            c[f"{which}_scale"] = scale(axis)
        return c

    def line_chart(ax):
        c = point_chart(ax, "line")
        for line in ax.get_lines():
            if is_straight_segment(line):
                continue
            xs, ys = line.get_xdata(), line.get_ydata()
            c["elements"].append(
                {
                    "label": auto_label(str(line.get_label()), "_child", "Line"),
                    "points": [[value(x), value(y)] for x, y in zip(xs, ys)],
                }
            )
        return c

    def scatter_chart(ax):
        from matplotlib.collections import PathCollection

        c = point_chart(ax, "scatter")
        x_dates, y_dates = is_date_axis(ax.xaxis), is_date_axis(ax.yaxis)

        def coord(v, dates):
            if dates and value(v) is not None:
                import matplotlib.dates as mdates

                return mdates.num2date(float(v)).isoformat()
            return value(v)

        for coll in ax.collections:
            if not isinstance(coll, PathCollection):
                continue
            c["elements"].append(
                {
                    "label": auto_label(str(coll.get_label()), "_child", "Scatter"),
                    "points": [[coord(x, x_dates), coord(y, y_dates)] for x, y in coll.get_offsets()],
                }
            )
        return c

    def category_label(axis, pos, span):
        """The tick label for a bar or box centred at `pos` on `axis` (`span`: its width)."""
        locs = list(axis.get_ticklocs())
        labels = [t.get_text() for t in axis.get_ticklabels()]
        best = None
        for loc, label in zip(locs, labels):
            d = abs(float(loc) - pos)
            if best is None or d < best[0]:
                best = (d, label)
        if best is not None and best[1] and best[0] <= max(span, 0.5) * 0.5 + 1e-9:
            return best[1]
        return f"{pos:g}"

    def bar_chart(ax):
        from matplotlib.container import BarContainer

        containers = [k for k in ax.containers if isinstance(k, BarContainer)]

        def horizontal(k):
            o = getattr(k, "orientation", None)
            if o in ("vertical", "horizontal"):
                return o == "horizontal"
            hs = [r.get_height() for r in k.patches]
            ws = [r.get_width() for r in k.patches]
            return len(set(hs)) == 1 and len(set(ws)) > 1

        swap = bool(containers) and horizontal(containers[0])
        c = chart_2d(ax, "bar", swap=swap)
        for k in containers:
            group = auto_label(str(k.get_label()), "_container", "Group")
            h = horizontal(k)
            axis = ax.yaxis if h else ax.xaxis
            for r in k.patches:
                if h:
                    pos, span, v = r.get_y() + r.get_height() / 2, r.get_height(), r.get_width()
                else:
                    pos, span, v = r.get_x() + r.get_width() / 2, r.get_width(), r.get_height()
                c["elements"].append(
                    {
                        "label": category_label(axis, float(pos), abs(float(span))),
                        "group": group,
                        "value": value(v),
                    }
                )
        return c

    def pie_chart(ax):
        from matplotlib.patches import Wedge

        return {
            "type": "pie",
            "title": axes_title(ax),
            "elements": [
                {
                    "label": str(w.get_label()),
                    "angle": round(abs(float(w.theta2) - float(w.theta1)), 4),
                    "radius": value(w.r),
                }
                for w in ax.patches
                if isinstance(w, Wedge)
            ],
        }

    def box_chart(ax):
        from matplotlib.patches import PathPatch

        boxes = [b for b in map(box_outline, ax.get_lines()) if b is not None]
        for p in ax.patches:
            if not isinstance(p, PathPatch):
                continue
            v = p.get_path().vertices
            boxes.append(
                [float(v[:, 0].min()), float(v[:, 0].max()), float(v[:, 1].min()), float(v[:, 1].max())]
            )
        if not boxes:
            raise ValueError("no boxes")
        widths = {round(b[1] - b[0], 9) for b in boxes}
        heights = {round(b[3] - b[2], 9) for b in boxes}
        # Vertical boxes share a width; horizontal ones share a height.
        vertical = len(widths) == 1 or len(heights) != 1
        c = chart_2d(ax, "box_and_whisker", swap=not vertical)
        if not vertical:
            boxes = [[b[2], b[3], b[0], b[1]] for b in boxes]
        tol = 1e-9
        stats = [
            {"c0": b[0], "c1": b[1], "q1": b[2], "q3": b[3], "lo": None, "hi": None, "med": None, "out": []}
            for b in boxes
        ]

        def owner(pos):
            for s in stats:
                if s["c0"] - tol <= pos <= s["c1"] + tol:
                    return s
            return None

        for line in ax.get_lines():
            if box_outline(line) is not None:
                continue
            cs, vs = line.get_xdata(), line.get_ydata()
            if not vertical:
                cs, vs = vs, cs
            cs = [float(x) for x in cs]
            vs = [float(y) for y in vs]
            if len(cs) == 2 and cs[0] == cs[1]:
                s = owner(cs[0])
                if s is None:
                    continue
                lo, hi = min(vs), max(vs)
                if hi <= s["q1"] + tol:
                    s["lo"] = lo
                elif lo >= s["q3"] - tol:
                    s["hi"] = hi
            elif len(cs) == 2 and vs[0] == vs[1]:
                s = owner((cs[0] + cs[1]) / 2)
                if s is not None and s["q1"] - tol <= vs[0] <= s["q3"] + tol and s["med"] is None:
                    s["med"] = vs[0]
            else:
                for x, y in zip(cs, vs):
                    s = owner(x)
                    if s is not None and math.isfinite(y):
                        s["out"].append(y)
        axis = ax.xaxis if vertical else ax.yaxis
        for s in stats:
            mid = (s["c0"] + s["c1"]) / 2
            c["elements"].append(
                {
                    "label": category_label(axis, mid, s["c1"] - s["c0"]),
                    "min": s["lo"] if s["lo"] is not None else s["q1"],
                    "first_quartile": s["q1"],
                    "median": s["med"] if s["med"] is not None else (s["q1"] + s["q3"]) / 2,
                    "third_quartile": s["q3"],
                    "max": s["hi"] if s["hi"] is not None else s["q3"],
                    "outliers": s["out"],
                }
            )
        return c

    def axes_chart(ax):
        kind = chart_type(ax)
        if kind is None:
            return None
        build = {
            "line": line_chart,
            "scatter": scatter_chart,
            "bar": bar_chart,
            "pie": pie_chart,
            "box_and_whisker": box_chart,
        }.get(kind)
        if build is not None:
            try:
                return build(ax)
            except Exception:
                pass
        return {"type": "unknown", "title": axes_title(ax), "elements": []}

    def figure_chart(fig):
        axes = list(fig.get_axes())
        if len(axes) == 1:
            return axes_chart(axes[0])
        charts = [axes_chart(ax) for ax in axes]
        if not any(charts):
            return None
        get_suptitle = getattr(fig, "get_suptitle", None)
        if get_suptitle is not None:
            title = get_suptitle()
        else:
            title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else ""
        empty = {"type": "line", "title": None, "elements": [], "x_label": None, "y_label": None,
                 "x_unit": None, "y_unit": None, "x_ticks": [], "x_tick_labels": [],
                 "x_scale": "linear", "y_ticks": [], "y_tick_labels": [], "y_scale": "linear"}
        return {
            "type": "superchart",
            "title": text_or_none(title),
            "elements": [c if c is not None else empty for c in charts],
        }

    # ---- formatters ---------------------------------------------------------------------------

    class E2BDataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

        def __call__(self, obj):
            pd = sys.modules.get("pandas")
            if pd is not None and isinstance(obj, pd.DataFrame):
                try:
                    return frame_data(obj)
                except Exception:
                    return None
            try:
                return super().__call__(obj)
            except Exception:
                return None

    class E2BChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            mfigure = sys.modules.get("matplotlib.figure")
            if mfigure is not None and isinstance(obj, mfigure.Figure):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        return figure_chart(obj)
                except Exception:
                    return None
            try:
                return super().__call__(obj)
            except Exception:
                return None

    formatters = shell.display_formatter.formatters
    formatters["e2b/data"] = E2BDataFormatter(parent=shell.display_formatter)
    formatters["e2b/chart"] = E2BChartFormatter(parent=shell.display_formatter)

    # ---- PIL images ---------------------------------------------------------------------------
    # As in E2B's sandboxes: an image saved to a file, or shown, is also a result (a PNG). A
    # sandbox has no screen, so showing is only that.

    try:
        from PIL import Image, ImageShow
    except ImportError:
        return
    from IPython.display import display

    save_to = Image.Image.save

    def save(image, fp, format=None, **params):
        if isinstance(fp, (str, os.PathLike)):
            display(image)
        return save_to(image, fp, format, **params)

    class ResultViewer(ImageShow.Viewer):
        def show(self, image, **options):
            display(image)
            return 1

    Image.Image.save = save
    ImageShow.register(ResultViewer, order=-1)


try:
    _airlock_startup()
except Exception:
    pass
finally:
    del _airlock_startup
