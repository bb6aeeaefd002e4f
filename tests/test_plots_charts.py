"""plots/charts.py's options for the teaching modules that compose it: runs that coincide,
steps counted from 1, series without markers."""

from course_lib.plots import charts, style


def test_nested_runs_get_hollow_markers_each_smaller_than_the_one_before():
    fig = charts.lines({"a": [1.0, 0.5], "b": [1.0, 0.5], "c": [1.0, 0.5]}, nested=True,
                       markersize=4)
    drawn = fig.axes[0].get_lines()
    assert [ln.get_markersize() for ln in drawn] == [8, 6, 4]
    assert {ln.get_fillstyle() for ln in drawn} == {"none"}
    plain = charts.lines({"a": [1.0], "b": [1.0]}, markersize=4).axes[0].get_lines()
    assert [ln.get_markersize() for ln in plain] == [4, 4]
    assert {ln.get_fillstyle() for ln in plain} == {"full"}


def test_steps_may_start_at_one_and_the_cross_names_that_step():
    fig = charts.lines({"ok": [3.0, 2.0], "diverged": [3.0, float("nan")]}, first_step=1)
    ax = fig.axes[0]
    assert list(ax.get_lines()[0].get_xdata()) == [1, 2]
    cross = [ln for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert [list(c.get_xdata()) for c in cross] == [[2]]
    assert [t.get_text() for t in ax.texts] == ["diverged: inf/nan from step 2"]


def test_series_style_without_markers_keeps_colour_and_line_style():
    for i in (0, 3, 11):
        bare = charts.series_style(i, markers=False)
        assert bare["marker"] == ""
        assert {k: v for k, v in bare.items() if k != "marker"} == {
            k: v for k, v in style.rank_style(i).items() if k != "marker"}
