"""The report of a fleet's ledger: one point per release and host that has the figure, in the
ledger's order; simulated figures marked; the same bytes for the same ledger; the page's table."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from io import BytesIO

import pytest
from PIL import Image

from ansible_collections.biv100.serving.plugins.plugin_utils._report import (
    INDEX,
    LATENCY_PLOT,
    PLOTS,
    QUALITY_PLOT,
    SCORE_PLOT,
    ReportError,
    figure_cells,
    figures,
    gate_cells,
    load_ledger,
    render,
    rows,
    series,
)

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
    with pytest.raises(ReportError, match=r"ledger.jsonl, line 3: not JSON"):
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
