"""The report of a fleet's ledger: one point per release and host that has the figure, in the
ledger's order; simulated figures marked; the same bytes for the same ledger; the page's table;
and a plot and a table per tuning run, read from the files tune.yml writes."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from io import BytesIO
from random import Random

import pytest
from PIL import Image

from ansible_collections.biv100.serving.plugins.plugin_utils._canary_analysis import (
    analyse,
    canary_record,
    correctness_pairs,
    paired,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._figure_cells import figure_cells
from ansible_collections.biv100.serving.plugins.plugin_utils._report import INDEX, plot_names, render
from ansible_collections.biv100.serving.plugins.plugin_utils._report_canary import analyses, canary_figure
from ansible_collections.biv100.serving.plugins.plugin_utils._report_figures import LATENCY_PLOT, PLOTS, QUALITY_PLOT, SCORE_PLOT, figures, series
from ansible_collections.biv100.serving.plugins.plugin_utils._report_ledger import ReportError, gate_cells, load_ledger, rows
from ansible_collections.biv100.serving.plugins.plugin_utils._report_tuning import load_tuning_runs, tune_figure
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_results import (
    append_candidate,
    candidate_record,
    write_proposal,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_space import make_candidate

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HOSTS = ("h1", "h2", "h3")


def bench(score, simulated=True, gate=8000):
    """An engine_bench result as the ledger records it (the contract's keys)."""
    def latency(base):
        return {"mean": base, "p50": base, "p90": base * 1.5, "p99": base * 2}

    return {"score": score, "input_tps": 2000.0, "output_tps": (score - 340) / 0.83, "total_tps": 9000.0,
            "request_tps": 2.5, "requests": {"ok": 64, "failed": 0}, "ttft_ms": latency(score / 50),
            "tpot_ms": latency(score / 400), "itl_ms": latency(20.0), "e2e_ms": latency(3000.0),
            "weights": {"output": 0.83, "input": 0.17}, "gate": {"score": gate, "passed": score >= gate},
            "simulated": simulated, "workload": "random 1024/256"}


def quality(deviation, simulated=True, baseline="r0"):
    return {"score": 0.9 * (1 + (deviation or 0)), "cases": 200, "correct": 180,
            "baseline": {"release": baseline, "score": 0.9} if deviation is not None else None,
            "deviation": deviation, "bound": 0.04, "passed": deviation is None or abs(deviation) <= 0.04,
            "simulated": simulated}


def line(release, host, minute, **fields):
    return dict({"time": f"2026-12-01T10:{minute:02d}:00Z", "host": host, "playbook": "deploy.yml",
                 "submission": release, "release": release, "state": "good",
                 "probes": "49/49 probes passed", "failed_probes": []}, **fields)


def ledger(releases: int, simulated=True) -> list[dict]:
    """releases deploys on HOSTS, each with bench and quality figures (the first release is the
    quality baseline: no deviation), every host's release verified afterwards (lines without
    figures), and one release (r2, when there is one) without figures at all."""
    lines, minute = [], 0
    for index in range(releases):
        release = f"r{index}"
        for number, host in enumerate(HOSTS, start=1):
            minute += 1
            figures = {} if release == "r2" else {
                "bench": bench(7000.0 + 500 * index + 10 * number, simulated),
                "quality": quality(None if index == 0 else -0.01 * index + 0.001 * number, simulated)}
            lines.append(line(release, host, minute, **figures))
        for host in HOSTS:
            minute += 1
            lines.append(line(release, host, minute, playbook="verify.yml"))
    return lines


def write(tmp_path, lines) -> str:
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in lines))
    return path


# --- rows and series ------------------------------------------------------------------------------


@pytest.mark.parametrize("releases", [1, 2, 5, 9])
def test_each_series_has_one_point_per_recorded_release_and_host_with_the_figure(releases):
    plotted = series(rows(ledger(releases)))

    measured = [f"r{index}" for index in range(releases) if index != 2]
    pairs = [(release, host) for release in measured for host in HOSTS]
    assert [(point.release, point.host) for point in plotted["score"]] == pairs
    for key in ("ttft_ms", "tpot_ms"):
        for percentile in ("p50", "p90", "p99"):
            assert [(point.release, point.host) for point in plotted["latency"][key][percentile]] == pairs
    # The baseline release has no deviation from itself: not plotted.
    assert [(point.release, point.host) for point in plotted["deviation"]] == [
        pair for pair in pairs if pair[0] != "r0"]
    assert plotted["releases"] == [f"r{index}" for index in range(releases)]
    assert plotted["gates"] == [8000.0] and plotted["bounds"] == [0.04]
    assert plotted["score"][0].value == 7010.0 and plotted["score"][0].simulated


def test_releases_keep_the_order_they_first_appear_in_and_the_last_figure_of_a_pair_counts():
    lines = [line("sub510", "h1", 1, bench=bench(8100.0)),
             line("sub168", "h1", 2, bench=bench(7000.0)),
             line("sub510", "h1", 3, bench=bench(8300.0)),   # a later deploy of the same release
             line("sub510", "h1", 4, playbook="verify.yml"),  # no figures: keeps 8300
             line("sub510", "h2", 5, bench=bench(8200.0))]
    table = rows(lines)

    assert [(row.release, row.host) for row in table] == [("sub510", "h1"), ("sub510", "h2"), ("sub168", "h1")]
    assert [point.value for point in series(table)["score"]] == [8300.0, 8200.0, 7000.0]


def test_a_rolled_back_deploys_figures_belong_to_the_release_they_were_measured_on():
    lines = [line("sub510", "h1", 1, bench=bench(8400.0)),
             # sub511 missed the gate on h1, which went back to sub510: the line names sub510.
             line("sub510", "h1", 2, state="rolled back", bench=bench(6100.0),
                  rollback={"from": "sub511", "to": "sub510", "files": ["a.py"]}),
             # A line without a release (the run stopped before staging) is no release's.
             line(None, "h1", 3)]
    table = rows(lines)

    assert [(row.release, row.state) for row in table] == [("sub510", "good"), ("sub511", "rolled back to sub510")]
    assert [(point.release, point.value) for point in series(table)["score"]] == [("sub510", 8400.0),
                                                                                  ("sub511", 6100.0)]
    # The line's probes are the re-probe of sub510 after the rollback, not sub511's verdict.
    assert [gate for gate, _passed, _why in gate_cells(table[1])] == ["throughput"]


def test_broken_or_partial_figures_are_left_out_not_drawn_as_zero():
    lines = [line("r1", "h1", 1, bench={"score": "fast"}, quality={"score": 0.9, "deviation": None}),
             line("r1", "h2", 2, bench={**bench(8100.0), "ttft_ms": {"p50": 10.0}, "tpot_ms": None})]
    plotted = series(rows(lines))

    assert [(point.host, point.value) for point in plotted["score"]] == [("h2", 8100.0)]
    assert [point.value for point in plotted["latency"]["ttft_ms"]["p50"]] == [10.0]
    assert plotted["latency"]["ttft_ms"]["p99"] == plotted["latency"]["tpot_ms"]["p50"] == []
    assert plotted["deviation"] == []


def test_a_ledger_line_that_is_not_json_is_named_by_its_number(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps(line("r1", "h1", 1)) + "\n\n{half a line\n")
    with pytest.raises(ReportError, match=r"ledger.jsonl: line 3: not JSON"):
        load_ledger(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ReportError, match=r"line 1: not a JSON object"):
        load_ledger(path)


# --- what matplotlib is handed ----------------------------------------------------------------------


def plotted_points(figure) -> dict[str, list[tuple[float, float]]]:
    """gid -> the (x, y) of each point the figure's data artists draw."""
    found = {}
    for axes in figure.axes:
        for collection in axes.collections:
            if collection.get_gid():
                found[collection.get_gid()] = [tuple(map(float, xy)) for xy in collection.get_offsets()]
    return found


def tick_labels(axes) -> list[str]:
    return [label.get_text() for label in axes.get_xticklabels()]


def test_the_figures_draw_exactly_the_series_one_point_per_release_and_host():
    plotted = series(rows(ledger(5)))
    drawn = figures(plotted, list(HOSTS))
    measured = ["r0", "r1", "r3", "r4"]  # r2 has no figures: no place on any axis

    score = plotted_points(drawn[SCORE_PLOT])
    assert sorted(score) == [f"score:{host}" for host in HOSTS]
    for host in HOSTS:
        points = score[f"score:{host}"]
        assert [y for _x, y in points] == [p.value for p in plotted["score"] if p.host == host]
        # Each point sits on its release's tick (hosts a little apart).
        assert [round(x) for x, _y in points] == list(range(len(measured)))
    assert tick_labels(drawn[SCORE_PLOT].axes[0]) == measured
    assert [line.get_ydata()[0] for line in drawn[SCORE_PLOT].axes[0].lines
            if line.get_label().startswith("gate")] == [8000.0]

    latency = plotted_points(drawn[LATENCY_PLOT])
    assert len(latency) == 2 * 3 * len(HOSTS)
    for key in ("ttft_ms", "tpot_ms"):
        for percentile in ("p50", "p90", "p99"):
            for host in HOSTS:
                assert [y for _x, y in latency[f"{key}:{percentile}:{host}"]] == [
                    p.value for p in plotted["latency"][key][percentile] if p.host == host]

    deviation = plotted_points(drawn[QUALITY_PLOT])
    for host in HOSTS:
        assert [y for _x, y in deviation[f"deviation:{host}"]] == pytest.approx(
            [100 * p.value for p in plotted["deviation"] if p.host == host])
    assert tick_labels(drawn[QUALITY_PLOT].axes[0]) == ["r1", "r3", "r4"]
    # The ±4 % band of the quality gate.
    [band] = drawn[QUALITY_PLOT].axes[0].patches
    assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((-4.0, 4.0))


def test_the_gate_line_the_band_and_the_weights_are_those_the_figures_recorded():
    lines = [line("r1", "h1", 1, bench=dict(bench(9100.0, gate=9000), weights={"output": 0.9, "input": 0.1}),
                  quality={**quality(-0.045), "bound": 0.05, "passed": True})]
    plotted = series(rows(lines))
    assert plotted["gates"] == [9000.0] and plotted["bounds"] == [0.05]
    assert plotted["weights"] == {"output": 0.9, "input": 0.1}

    drawn = figures(plotted, ["h1"])
    assert [line.get_ydata()[0] for line in drawn[SCORE_PLOT].axes[0].lines
            if line.get_label().startswith("gate")] == [9000.0]
    assert "(0.9 × output tok/s + 0.1 × input tok/s)" in titles(drawn[SCORE_PLOT])
    [band] = drawn[QUALITY_PLOT].axes[0].patches
    assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((-5.0, 5.0))
    page = render(lines, "lab")[INDEX].decode()
    assert ("0.9 × output tok/s + 0.1 × input tok/s per release and host; the dashed line is the throughput gate "
            "(9000).") in page
    assert "the band is the quality gate (±5 %)." in page
    assert "quality: passed</span> – deviation -4.5 %, gate ±5 % (sim)" in page
    assert "throughput: passed</span> – score 9100, gate ≥ 9000 (sim)" in page


def test_a_ledger_without_figures_names_no_gate():
    page = render([line("r1", "h1", 1)], "lab")[INDEX].decode()
    assert "<p>The weighted score per release and host.</p>" in page
    assert "<p>Deviation of the quality score from the baseline release.</p>" in page
    assert series(rows([line("r1", "h1", 1)]))["gates"] == []


def test_a_ledger_without_figures_gives_plots_that_say_so():
    drawn = figures(series(rows([line("r1", "h1", 1)])), ["h1"])
    for name in PLOTS:
        assert plotted_points(drawn[name]) == {}
        texts = [text.get_text() for axes in drawn[name].axes for text in axes.texts]
        assert texts and all(text.startswith("no release has") for text in texts)


# --- simulated figures --------------------------------------------------------------------------------


def titles(figure) -> str:
    found = [axes.get_title() for axes in figure.axes]
    if figure._suptitle is not None:
        found.append(figure._suptitle.get_text())
    return " ".join(found)


def legend_labels(figure) -> list[str]:
    return [text.get_text() for axes in figure.axes if axes.get_legend() for text in axes.get_legend().get_texts()]


def test_simulated_figures_are_named_in_every_plot_hollow_and_marked_in_the_table():
    drawn = figures(series(rows(ledger(3, simulated=True))), list(HOSTS))
    for name in PLOTS:
        assert "simulated" in titles(drawn[name]), name
        assert any("simulated" in label for label in legend_labels(drawn[name])), name
    [points] = [c for c in drawn[SCORE_PLOT].axes[0].collections if c.get_gid() == "score:h1"]
    assert all(face[3] == 0 for face in points.get_facecolors())  # hollow

    page = render(ledger(3, simulated=True), "lab")[INDEX].decode()
    assert "Simulated figures." in page
    assert "7010 (sim)" in page


def test_figures_from_a_real_engine_are_not_marked_and_a_mixed_plot_says_which_are_simulated():
    real = ledger(3, simulated=False)
    drawn = figures(series(rows(real)), list(HOSTS))
    for name in PLOTS:
        assert "simulated" not in titles(drawn[name]) + " ".join(legend_labels(drawn[name]))
    page = render(real, "biv100")[INDEX].decode()
    assert "(sim)" not in page and "Simulated figures." not in page

    mixed = real + [line("r9", "h1", 59, bench=bench(9000.0, simulated=True))]
    assert "hollow points simulated" in titles(figures(series(rows(mixed)), list(HOSTS))[SCORE_PLOT])


# --- files -------------------------------------------------------------------------------------------


def test_the_plots_are_valid_pngs_and_two_renders_are_byte_identical():
    first = render(ledger(4), "lab")
    second = render(ledger(4), "lab")

    assert sorted(first) == sorted([*PLOTS, INDEX])
    assert first == second
    for name in PLOTS:
        assert first[name].startswith(PNG_SIGNATURE)
        with Image.open(BytesIO(first[name])) as image:
            image.verify()
        # No chunk naming the software (its version would change the bytes on an upgrade).
        assert b"Software" not in first[name] and b"atplotlib" not in first[name]
    assert render(ledger(5), "lab")[SCORE_PLOT] != first[SCORE_PLOT]


class Cells(HTMLParser):
    """The text of each table row's cells, and the page's image sources and scripts."""

    def __init__(self):
        super().__init__()
        self.rows, self.images, self.scripts, self.links = [], [], 0, []
        self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append(" / ")
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "script":
            self.scripts += 1
        elif tag == "link":
            self.links.append(attrs)

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(re.sub(r"\s+", " ", "".join(self._cell)).strip())
            self._cell = None

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_the_page_shows_the_plots_and_one_table_row_per_release_and_host():
    lines = ledger(3) + [
        line("r3", "h1", 50, state="rolled back", bench=bench(6100.0), quality=quality(-0.07),
             rollback={"from": "r3", "to": "r1", "files": []}, failed_probes=["n-two"],
             probes="48/49 probes passed")]
    page = Cells()
    page.feed(render(lines, "lab")[INDEX].decode())

    assert page.images == list(PLOTS) and page.scripts == 0 and page.links == []
    header, *body = page.rows
    assert header == ["release", "host", "state", "score", "output tok/s", "TTFT p99", "quality", "gates"]
    assert [(row[0], row[1]) for row in body] == [(f"r{index}", host) for index in range(3) for host in HOSTS] + [
        ("r3", "h1")]
    first = body[0]
    assert first[2:7] == ["good", "7010 (sim)", "8036.1 (sim)", "280.4 ms (sim)", "0.900 (sim)"]
    assert first[7] == ("functional: passed – 49/49 probes passed / quality: passed – no baseline to compare "
                        "with yet (sim) / throughput: FAILED – score 7010, gate ≥ 8000 (sim)")
    # A release without figures is listed, with blank figures.
    assert body[6][:7] == ["r2", "h1", "good", "", "", "", ""]
    assert body[-1][2] == "rolled back" and body[-1][6] == "0.837, -7.0 % (sim)"
    assert body[-1][7].startswith("functional: FAILED – failed: n-two / quality: FAILED – deviation -7.0 %, gate ±4 % (sim)")


def test_the_page_shows_what_the_ledger_says_as_text_never_as_markup():
    hostile = "<script>alert('x')</script>"
    lines = [line("r1", f"h1{hostile}", 1, state=f"good & {hostile}", failed_probes=[hostile],
                  probes="1/2 probes passed")]
    text = render(lines, f"lab{hostile}")[INDEX].decode()
    page = Cells()
    page.feed(text)

    assert page.scripts == 0 and "<script>" not in text
    assert "<title>biv100.serving releases: lab&lt;script&gt;" in text
    [_header, row] = page.rows
    assert row[1:3] == [f"h1{hostile}", f"good & {hostile}"]
    assert row[7] == f"functional: FAILED – failed: {hostile}"


def test_figure_cells_are_blank_without_figures_and_marked_when_simulated():
    assert figure_cells(None, None) == ("", "", "", "")
    assert figure_cells({"score": None}, {"deviation": 0.1}) == ("", "", "", "")
    assert figure_cells(bench(8412.4, simulated=False), quality(0.012, simulated=False)) == (
        "8412", "9725.8", "336.5 ms", "0.911, +1.2 %")
    assert figure_cells(bench(8412.4), quality(None)) == ("8412 (sim)", "9725.8 (sim)", "336.5 ms (sim)",
                                                          "0.900 (sim)")


# --- canary analyses ---------------------------------------------------------------------------------


def quartiles(low, p25, median, p75, high, count=72, mean=None):
    return {"count": count, "min": low, "p25": p25, "median": median, "p75": p75, "max": high,
            "mean": median if mean is None else mean}


def canary_metric(name, classification, shift=None, interval=None, canary=None, baseline=None, **fields):
    """One metric as canary_record() keeps it; a NoData metric has no shift, interval or test."""
    metric = {"name": name, "group": "throughput", "better": "higher", "margin_pct": 2.0, "critical": False,
              "classification": classification, "conclusive": classification != "NoData",
              "canary": canary or {"count": 0}, "baseline": baseline or {"count": 0}}
    if classification != "NoData":
        metric.update(shift_pct=shift, interval_pct=interval, confidence=0.98, p_value=0.001)
    return {**metric, **fields}


def canary_analysis(verdict="fail", score=0.0, simulated=True, kind="same window", host="h2", release="r0",
                    metrics=None):
    """A canary record as the ledger callback keeps it on the canary host's line."""
    return {"verdict": verdict, "score": score, "accepted": False, "trials": 3,
            "baseline": {"host": host, "kind": kind, "release": release},
            "reasons": ["score -8.8 % [-9.3, -8.3] < -2 %"] if verdict == "fail" else [],
            "thresholds": {"pass": 75.0, "marginal": 50.0}, "simulated": simulated,
            "metrics": metrics if metrics is not None else [
                canary_metric("score", "Low", -8.8, [-9.3, -8.3], critical=True, confidence=0.9,
                              canary=quartiles(9100.0, 9120.0, 9130.0, 9140.0, 9150.0, count=3),
                              baseline=quartiles(9980.0, 10000.0, 10010.0, 10020.0, 10040.0, count=3)),
                canary_metric("ttft_ms", "Pass", 1.2, [-0.4, 2.9], better="lower", margin_pct=10.0,
                              canary=quartiles(20.0, 24.0, 25.3, 27.0, 35.0, mean=25.9),
                              baseline=quartiles(19.0, 23.5, 25.0, 26.5, 33.0)),
                canary_metric("e2e_ms", "NoData", better="lower", margin_pct=10.0,
                              baseline=quartiles(50.0, 55.0, 60.0, 65.0, 80.0))]}


def canary_ledger(**analysis) -> list[dict]:
    """r0 on h1 and h2, then r1 deployed to the canary h1, judged against h2 and rolled back."""
    return [line("r0", "h1", 1, bench=bench(10010.0)), line("r0", "h2", 2, bench=bench(10010.0)),
            line("r0", "h1", 3, state="rolled back", bench=bench(9130.0), canary=canary_analysis(**analysis),
                 rollback={"from": "r1", "to": "r0", "files": []})]


def panels(figure) -> dict[str, object]:
    """metric name -> the axes of its panel."""
    return {axes.get_title().split(" ")[0]: axes for axes in figure.axes}


def artists(figure, gid: str) -> list:
    return [artist for axes in figure.axes for artist in [*axes.patches, *axes.lines] if artist.get_gid() == gid]


def test_a_ledger_with_a_canary_analysis_draws_it_and_one_without_draws_no_canary_plot():
    with_canary = render(canary_ledger(), "lab")
    without = render(ledger(2), "lab")

    # The rolled-back canary's line names r0; its analysis judged r1, the release it left.
    assert [name for name in with_canary if name.startswith("canary")] == ["canary-r1.png"]
    assert with_canary["canary-r1.png"].startswith(PNG_SIGNATURE)
    assert plot_names(with_canary) == [*PLOTS, "canary-r1.png"]
    assert sorted(without) == sorted([*PLOTS, INDEX]) and plot_names(without) == list(PLOTS)
    assert "No canary analysis in the ledger yet" in without[INDEX].decode()
    assert "No canary analysis in the ledger yet" not in with_canary[INDEX].decode()
    assert render(canary_ledger(), "lab") == with_canary  # byte-identical, the canary plot too


def test_each_metric_is_two_boxes_drawn_from_the_recorded_quartiles_titled_with_its_verdict():
    [analysis] = analyses(canary_ledger())
    figure = canary_figure(analysis)
    shown = panels(figure)

    assert list(shown) == ["score", "ttft_ms", "e2e_ms"]
    assert shown["score"].get_title() == ("score Low -8.8 % [-9.3, -8.3]\n"
                                          "90 % interval; higher is better, margin 2 %; critical")
    assert shown["ttft_ms"].get_title().startswith("ttft_ms Pass +1.2 % [-0.4, +2.9]\n98 % interval; lower is better")
    assert shown["e2e_ms"].get_title() == "e2e_ms NoData\nlower is better, margin 10 %"
    for name, metric in (("score", analysis.metrics[0]), ("ttft_ms", analysis.metrics[1])):
        for side in ("baseline", "canary"):
            [box] = artists(figure, f"canary:{name}:{side}:boxes")
            extents = box.get_path().get_extents()
            assert (extents.y0, extents.y1) == pytest.approx((metric[side]["p25"], metric[side]["p75"]))
            [median] = artists(figure, f"canary:{name}:{side}:medians")
            assert set(median.get_ydata()) == {metric[side]["median"]}
            whiskers = artists(figure, f"canary:{name}:{side}:whiskers")
            ends = [y for whisker in whiskers for y in whisker.get_ydata()]
            assert (min(ends), max(ends)) == (metric[side]["min"], metric[side]["max"])
            [mean] = artists(figure, f"canary:{name}:{side}:means")
            assert list(mean.get_ydata()) == [metric[side]["mean"]]
        assert [label.get_text() for label in shown[name].get_xticklabels()] == [
            f"baseline\nn={metric['baseline']['count']}", f"canary\nn={metric['canary']['count']}"]
    # The level the margin allows: 2 % under the baseline's median for a higher-is-better metric,
    # 10 % over it for a lower-is-better one.
    [allowed] = artists(figure, "canary:score:allowed")
    assert allowed.get_ydata()[0] == pytest.approx(10010.0 * 0.98)
    [allowed] = artists(figure, "canary:ttft_ms:allowed")
    assert allowed.get_ydata()[0] == pytest.approx(25.0 * 1.1)
    # NoData: the baseline's box alone, the canary's side says it has no samples.
    assert artists(figure, "canary:e2e_ms:baseline:boxes") and not artists(figure, "canary:e2e_ms:canary:boxes")
    assert [text.get_text() for text in shown["e2e_ms"].texts] == ["no samples"]
    assert shown["score"].title.get_color() == "#c62828" and shown["ttft_ms"].title.get_color() == "#1a7f37"


def test_the_figure_title_gives_the_verdict_the_score_and_the_kind_of_baseline():
    [same_window] = analyses(canary_ledger())
    title = canary_figure(same_window)._suptitle.get_text()
    assert title.startswith("Canary analysis of r1 on h1: fail, score 0 (pass ≥ 75, marginal ≥ 50)\n"
                            "baseline: h2 on r0 (same window); 3 trials")

    [historical] = analyses(canary_ledger(verdict="inconclusive", score=None, kind="historical", host=None,
                                          release=None))
    title = canary_figure(historical)._suptitle.get_text()
    assert ("Canary analysis of r1 on h1: inconclusive, no score" in title
            and "baseline: h1's own figures recorded with vendor files (historical: not measured in the same "
                "window)" in title)


def test_a_simulated_analysis_is_drawn_hollow_and_named_and_a_real_one_filled():
    [simulated] = analyses(canary_ledger(simulated=True))
    [real] = analyses(canary_ledger(simulated=False))

    hollow, filled = canary_figure(simulated), canary_figure(real)
    assert "hollow boxes: simulated (lab engine stand-in)" in hollow._suptitle.get_text()
    assert "simulated" not in filled._suptitle.get_text()
    [box] = artists(hollow, "canary:score:canary:boxes")
    assert box.get_facecolor()[3] == 0
    [box] = artists(filled, "canary:score:canary:boxes")
    assert box.get_facecolor()[3] == 1
    # The page's note on simulated figures counts the analysis: here the gates' figures are real.
    for simulated, noted in ((True, True), (False, False)):
        lines = [{**item, "bench": bench(10010.0, simulated=False)} for item in canary_ledger(simulated=simulated)]
        assert ("Simulated figures." in render(lines, "lab")[INDEX].decode()) is noted


def test_the_judges_own_record_is_drawn_one_panel_per_metric():
    def benches(rate, seed, label):
        rng = Random(seed)
        made = []
        for _trial in range(3):
            draw = 1 + rng.uniform(-0.01, 0.01)
            made.append({"label": label, "score": 10000 * rate * draw, "output_tps": 2500 * rate * draw,
                         "samples": {"ttft_ms": [25 / rate / draw], "tpot_ms": [0.2 / rate / draw],
                                     "e2e_ms": [60 / rate / draw]}})
        return made

    correct = {"qualities": [1.0], "probes": [[{"passed": True}] * 10]}
    analysis = analyse({**paired(benches(0.9, 1, "h1"), benches(1.0, 2, "h2")), **correctness_pairs(correct, correct)},
                       margin=0.05, request_margin=0.10, quality_margin=0.04, pass_score=95, marginal_score=75,
                       confidence=0.98)
    analysis.update(trials=3, baseline={"host": "h2", "kind": "same window", "release": "r0"}, simulated=True)
    lines = [line("r1", "h1", 1, canary=canary_record(analysis))]
    [drawn] = analyses(lines)

    titles_shown = [axes.get_title().split("\n")[0] for axes in canary_figure(drawn).axes]
    assert [title.split(" ")[0] for title in titles_shown] == [metric["name"] for metric in analysis["metrics"]]
    score = next(metric for metric in analysis["metrics"] if metric["name"] == "score")
    low, high = score["interval_pct"]
    assert titles_shown[0] == f"score Low {score['shift_pct']:+.1f} % [{low:+.1f}, {high:+.1f}]"
    assert render(lines, "lab")["canary-r1.png"].startswith(PNG_SIGNATURE)


def test_an_analysis_is_drawn_once_per_run_and_a_later_runs_gets_a_plot_of_its_own():
    record = canary_analysis()
    lines = [
        # A host of two engine instances: both lines of the run carry the host's one analysis.
        line("sub510", "h1/vllm-1", 1, canary=record), line("sub510", "h1/vllm-2", 1, canary=record),
        # The same release analysed again in a later run.
        line("sub510", "h1", 2, canary=canary_analysis(verdict="marginal", score=60.0)),
        line("2026-12-01T10:00:00Z/x", "h1", 3, canary=record),
        # Not an analysis: none recorded, a broken one, one without a verdict.
        line("sub511", "h1", 4), line("sub511", "h2", 4, canary="pass"), line("sub511", "h3", 4, canary={}),
    ]
    found = analyses(lines)

    assert [(item.release, item.host, item.plot) for item in found] == [
        ("sub510", "h1", "canary-sub510.png"), ("sub510", "h1", "canary-sub510-2.png"),
        ("2026-12-01T10:00:00Z/x", "h1", "canary-2026-12-01T10_00_00Z_x.png")]
    assert [name for name in render(lines, "lab") if name.startswith("canary")] == [item.plot for item in found]


def test_a_side_whose_quartiles_are_incomplete_gets_no_box_and_an_analysis_without_metrics_says_so():
    partial = {"count": 5, "min": 1.0, "p25": None, "median": 2.0, "p75": 3.0, "max": 4.0, "mean": 2.0}
    [analysis] = analyses(canary_ledger(metrics=[canary_metric("score", "Pass", 0.0, [-1.0, 1.0], canary=partial,
                                                               baseline=quartiles(1.0, 1.5, 2.0, 2.5, 3.0))]))
    figure = canary_figure(analysis)
    assert not artists(figure, "canary:score:canary:boxes") and artists(figure, "canary:score:baseline:boxes")
    assert [text.get_text() for text in figure.axes[0].texts] == ["no quartiles recorded"]

    [empty] = analyses(canary_ledger(metrics=[]))
    texts = [text.get_text() for axes in canary_figure(empty).axes for text in axes.texts]
    assert texts == ["the analysis recorded no metric"]


def test_the_page_lists_each_analysis_with_its_baseline_verdict_and_reasons_above_its_plot():
    hostile = "<b>x</b>"
    lines = canary_ledger() + [
        line("r2", "h1", 9, canary={**canary_analysis(verdict="marginal", score=60.0, kind="historical", host=None),
                                    "accepted": True, "reasons": [f"ttft_ms {hostile}", "tpot_ms"]})]
    text = render(lines, "lab")[INDEX].decode()
    page = Cells()
    page.feed(text)

    assert page.images == [*PLOTS, "canary-r1.png", "canary-r2.png"]
    header = ["release", "canary", "baseline", "baseline kind", "baseline release", "verdict", "score", "trials",
              "reasons"]
    start = page.rows.index(header)
    assert page.rows[start + 1:] == [
        ["r1", "h1", "h2", "same window", "r0", "fail (sim)", "0", "3", "score -8.8 % [-9.3, -8.3] < -2 %"],
        ["r2", "h1", "h1 (own record)", "historical", "r0", "marginal (accepted) (sim)", "60", "3",
         f"ttft_ms {hostile} / tpot_ms"]]
    assert '<span class="failed">fail (sim)</span>' in text and '<span class="doubtful">marginal' in text
    assert "<h3>r1 on h1, 2026-12-01T10:03:00Z: fail, score 0</h3>" in text
    assert hostile not in text and "&lt;b&gt;x&lt;/b&gt;" in text


# --- tuning runs --------------------------------------------------------------------------------------

TUNE_BASE = {"engine_args": {"max_num_seqs": 4, "max_num_batched_tokens": 4096}, "engine_allocator": {},
             "engine_env": {}}
TUNE_INCUMBENT = make_candidate(TUNE_BASE, incumbent=True)


def tune_candidate(**engine_args):
    return make_candidate({**TUNE_BASE, "engine_args": {**TUNE_BASE["engine_args"], **engine_args}})


SEQS_8, SEQS_16, SEQS_32, SEQS_64, SEQS_0, SEQS_12 = (tune_candidate(max_num_seqs=seqs)
                                                      for seqs in (8, 16, 32, 64, 0, 12))


def tune_figures(score, ttft, simulated=True, gate=7500.0):
    return {"score": score, "output_tps": score / 1.1, "input_tps": 1000.0, "ttft_p99_ms": ttft,
            "tpot_p99_ms": 3.0, "requests": 24, "simulated": simulated, "gate_score": gate}


def tune_run(folder, name="20260101T000000Z", simulated=True, gate=7500.0, proposal=True):
    """A run of two rounds as tune.yml writes it: the incumbent and 8, 16 measured in both (16 the
    best, 8 dominated in round 1 but on the front in round 2), 32 missing the quality gate, 64 out
    of memory, 0 invalid, 12 measured once and dropped after round 1; proposal.yml for 16."""
    path = folder / name / "candidates.jsonl"

    def add(candidate, status, round_number=None, factor=None, **extra):
        append_candidate(path, candidate_record(candidate, status, round_number=round_number, factor=factor,
                                                time="2026-01-01T00:00:00Z", **extra))

    def measured(candidate, round_number, score, ttft):
        add(candidate, "measured", round_number, 0.5 * round_number,
            figures=tune_figures(score, ttft, simulated, gate))

    add(SEQS_0, "invalid", problems=["engine_args.max_num_seqs: 0 is below 1\n(the host's CLI)", "another"])
    measured(TUNE_INCUMBENT, 1, 7800.0, 300.0)
    measured(SEQS_8, 1, 7700.0, 360.0)
    measured(SEQS_16, 1, 8600.0, 420.0)
    add(SEQS_32, "missed_gate", 1, 0.5, figures=tune_figures(8900.0, 700.0, simulated, gate),
        gates=["quality gate: deviation -5.2 %, gate ±4 %"])
    add(SEQS_64, "failed_to_start", 1, 0.5, log_tail="loading the model\ntorch.OutOfMemoryError: CUDA out of memory\n\n")
    measured(SEQS_12, 1, 7000.0, 500.0)
    measured(TUNE_INCUMBENT, 2, 7810.0, 290.0)
    measured(SEQS_8, 2, 8200.0, 330.0)
    measured(SEQS_16, 2, 8650.0, 410.0)
    if proposal:
        records = {record["id"]: record for record in map(json.loads, path.read_text().splitlines())}
        write_proposal(path.parent / "proposal.yml", records[SEQS_16["id"]], records[TUNE_INCUMBENT["id"]],
                       {"run": name, "host": "lab-h1"})
    return path


def lines_of(figure, gid) -> list:
    return [line for axes in figure.axes for line in axes.lines if line.get_gid() == gid]


def texts(figure) -> str:
    return "\n".join(text.get_text() for axes in figure.axes for text in axes.texts)


def test_a_tuning_run_is_drawn_each_candidate_at_its_last_round(tmp_path):
    tune_run(tmp_path)
    [run] = load_tuning_runs(tmp_path)
    figure = tune_figure(run, [])
    points = plotted_points(figure)

    assert run.name == "20260101T000000Z" and run.plot == "tune-20260101T000000Z.png"
    # Round 2's figures for the candidates it ran, round 1's for the one it dropped.
    assert points["tune:measured:2"] == [(330.0, 8200.0), (410.0, 8650.0)]
    assert points["tune:measured:1"] == [(500.0, 7000.0)]
    assert points["tune:incumbent"] == [(290.0, 7810.0)]
    assert points["tune:missed_gate"] == [(700.0, 8900.0)]
    # proposal.yml holds 16's settings: its point is ringed.
    assert points["tune:proposed"] == [(410.0, 8650.0)]
    assert f"proposed {SEQS_16['id']} (proposal.yml)" in legend_labels(figure)
    [front] = lines_of(figure, "tune:front")
    assert list(front.get_xdata()) == [290.0, 330.0, 410.0] and list(front.get_ydata()) == [7810.0, 8200.0, 8650.0]
    assert front.get_drawstyle() == "steps-post"
    [gate] = lines_of(figure, "tune:gate")
    assert list(gate.get_ydata()) == [7500.0, 7500.0]
    assert "throughput gate: score ≥ 7500, as the candidates recorded it" in legend_labels(figure)
    assert f"incumbent {TUNE_INCUMBENT['id']}" in legend_labels(figure)
    assert "measured, last in round 2 (bench × 1)" in legend_labels(figure)
    # The front is labelled with its ids; the candidates without a point are listed with why.
    assert {TUNE_INCUMBENT["id"], SEQS_8["id"], SEQS_16["id"]} <= set(texts(figure).split("\n"))
    assert f"{SEQS_64['id']}: failed to start - torch.OutOfMemoryError: CUDA out of memory" in texts(figure)
    assert f"{SEQS_0['id']}: invalid, never started - engine_args.max_num_seqs: 0 is below 1\n" in texts(figure)
    assert SEQS_32["id"] not in texts(figure)  # it has its point


def test_the_gate_line_is_the_runs_own_else_the_ledgers(tmp_path):
    def gate_of(folder, gate, ledger_gates):
        tune_run(tmp_path / folder, gate=gate)
        [run] = load_tuning_runs(tmp_path / folder)
        figure = tune_figure(run, ledger_gates)
        return [line.get_ydata()[0] for line in lines_of(figure, "tune:gate")], legend_labels(figure)

    assert gate_of("recorded", 7500.0, [9000.0])[0] == [7500.0]
    gates, labels = gate_of("unrecorded", None, [9000.0])
    assert gates == [9000.0] and "throughput gate: score ≥ 9000, as the ledger's figures recorded it" in labels
    assert gate_of("nowhere", None, [])[0] == []


def test_a_simulated_run_is_hollow_and_named_and_a_real_one_filled(tmp_path):
    tune_run(tmp_path / "sim")
    tune_run(tmp_path / "real", simulated=False)
    [simulated], [real] = load_tuning_runs(tmp_path / "sim"), load_tuning_runs(tmp_path / "real")
    drawn, real_drawn = tune_figure(simulated, []), tune_figure(real, [])

    assert "simulated (lab engine stand-in)" in titles(drawn) and "simulated" not in titles(real_drawn)
    for figure, alpha in ((drawn, 0), (real_drawn, 1)):
        [points] = [c for c in figure.axes[0].collections if c.get_gid() == "tune:measured:2"]
        assert all(face[3] == alpha for face in points.get_facecolors())
    page = render([], "lab", [simulated])[INDEX].decode()
    assert "Simulated figures." in page and "8650 (sim)" in page
    assert "(sim)" not in render([], "lab", [real])[INDEX].decode()


def test_tuning_plots_are_byte_identical_and_leave_the_ledgers_plots_as_they_were(tmp_path):
    tune_run(tmp_path, name="b-run")
    tune_run(tmp_path, name="a run: 1")
    (tmp_path / "no-results").mkdir()
    runs = load_tuning_runs(tmp_path)
    first, second = render(ledger(3), "lab", runs), render(ledger(3), "lab", load_tuning_runs(tmp_path))
    without = render(ledger(3), "lab")

    assert [run.name for run in runs] == ["a run: 1", "b-run"]
    assert plot_names(first) == [*PLOTS, "tune-a_run_1.png", "tune-b-run.png"]
    assert first == second
    assert {name: first[name] for name in PLOTS} == {name: without[name] for name in PLOTS}
    with Image.open(BytesIO(first["tune-b-run.png"])) as image:
        image.verify()
    assert b"Software" not in first["tune-b-run.png"]


def test_the_page_lists_each_runs_candidates_with_why_and_the_proposal(tmp_path):
    tune_run(tmp_path)
    text = render(ledger(1), "lab", load_tuning_runs(tmp_path))[INDEX].decode()
    page = Cells()
    page.feed(text)

    assert page.images[-1] == "tune-20260101T000000Z.png"
    header = ["candidate", "settings unlike the incumbent's", "status", "score", "TTFT p99", "round", "why"]
    start = page.rows.index(header)
    assert page.rows[start + 1:] == [
        [SEQS_0["id"], "engine_args.max_num_seqs 4 -> 0", "invalid, never started", "", "", "",
         "engine_args.max_num_seqs: 0 is below 1"],
        [f"{TUNE_INCUMBENT['id']} (incumbent)", "the host's settings", "measured", "7810 (sim)", "290.0 ms (sim)",
         "2 (× 1)", "on the Pareto front"],
        [SEQS_8["id"], "engine_args.max_num_seqs 4 -> 8", "measured", "8200 (sim)", "330.0 ms (sim)", "2 (× 1)",
         "on the Pareto front"],
        [SEQS_16["id"], "engine_args.max_num_seqs 4 -> 16", "measured", "8650 (sim)", "410.0 ms (sim)", "2 (× 1)",
         "best score, on the Pareto front"],
        [SEQS_32["id"], "engine_args.max_num_seqs 4 -> 32", "missed a gate", "8900 (sim)", "700.0 ms (sim)",
         "1 (× 0.5)", "quality gate: deviation -5.2 %, gate ±4 %"],
        [SEQS_64["id"], "engine_args.max_num_seqs 4 -> 64", "failed to start", "", "", "1 (× 0.5)",
         "torch.OutOfMemoryError: CUDA out of memory"],
        [SEQS_12["id"], "engine_args.max_num_seqs 4 -> 12", "measured", "7000 (sim)", "500.0 ms (sim)", "1 (× 0.5)",
         ""]]
    assert ("<h3>20260101T000000Z: 4 measured, 1 missed a gate, 1 failed to start, 1 invalid, never started</h3>"
            in text)
    assert f"The best eligible candidate by score: {SEQS_16['id']}; the throughput gate: a score of 7500" in text
    assert f"20260101T000000Z/proposal.yml proposes candidate {SEQS_16['id']}." in text
    assert "# " not in text and "host: lab-h1" in text


def test_a_run_without_a_proposal_or_an_eligible_candidate_says_so_and_no_run_gives_a_line(tmp_path):
    path = tmp_path / "r" / "candidates.jsonl"
    append_candidate(path, candidate_record(TUNE_INCUMBENT, "failed_to_start", round_number=1, factor=1.0, log_tail=""))
    [run] = load_tuning_runs(tmp_path)
    text = render([], "lab", [run])[INDEX].decode()
    assert "No candidate of this run cleared every gate." in text and "No proposal.yml" in text
    assert "the engine&#39;s log was empty" in text
    assert "no candidate of this run has a score and a TTFT p99 to place it" in texts(tune_figure(run, []))

    assert load_tuning_runs(tmp_path / "absent") == []
    files = render(ledger(1), "lab", [])
    assert not [name for name in files if name.startswith("tune-")]
    assert "No tuning run found" in files[INDEX].decode()


def test_a_torn_last_line_is_warned_about_and_a_broken_file_named(tmp_path):
    path = tune_run(tmp_path, proposal=False)
    with open(path, "a", encoding="utf-8") as stream:
        stream.write('{"id": "c-cut')
    warnings = []
    [run] = load_tuning_runs(tmp_path, warnings.append)
    assert len(run.candidates) == 7 and len(warnings) == 1 and "cut short" in warnings[0]
    assert "tune:proposed" not in plotted_points(tune_figure(run, []))  # no proposal.yml, no ring

    path.write_text("not json\n")
    with pytest.raises(ReportError, match=f"{path}: line 1: not JSON"):
        load_tuning_runs(tmp_path)
    path.write_text(json.dumps({"id": "x", "status": "measured"}) + "\n")
    (path.parent / "proposal.yml").write_text("- a list\n")
    with pytest.raises(ReportError, match="proposal.yml: not the mapping of engine settings"):
        load_tuning_runs(tmp_path)


def test_the_platforms_verdict_stands_beside_this_fleets_and_the_labs_and_a_disagreement_is_marked():
    fleet = ledger(2) + [line("r1", "h1", 59, playbook="record_verdict.yml",
                              platform={"verdict": "failed", "reason": "n=3 OOM", "figures": {}})]
    rolled_back = line("r1", "lab-h1", 2, state="rolled back", rollback={"from": "r2", "to": "r1", "files": []})
    lab = [line("r1", "lab-h1", 1), rolled_back]
    page = Cells()
    page.feed(render(fleet, "biv100", compared={"lab": lab})[INDEX].decode())

    header, *body = page.rows[:4]
    assert header == ["release", "biv100", "lab", "platform"]
    assert body == [
        ["r2", "-", "rolled back to r1 ×1", "no verdict recorded"],
        ["r1 (disagrees)", f"good ×{len(HOSTS)}", "good ×1", "failed: n=3 OOM"],
        ["r0", f"good ×{len(HOSTS)}", "-", "no verdict recorded"],
    ]
