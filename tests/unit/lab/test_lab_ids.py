"""What a lab id gives a lab on the machine: names, addresses and files that no lab of another id
has, lab 0 keeping the names `make deploy` and the committed inventory know."""

from __future__ import annotations

from pathlib import Path

import pytest

import lab


def test_lab_0_is_the_default_lab_with_unnumbered_names_and_the_committed_inventory(monkeypatch):
    monkeypatch.delenv(lab.LAB_ID_ENV, raising=False)
    default = lab.LabId.resolve()
    assert default == lab.LabId(0)
    assert (default.host_name(1), default.host_ip(1), default.subnet) == ("lab-h1", "10.77.0.11", "10.77.0.0/24")
    assert (default.bridge, default.veth(3), default.default_dir) == ("biv100-lab", "biv100-h3", "/tmp/biv100-lab")
    assert default.inventory_path(Path("/tmp/anywhere")) == lab.REPO_ROOT / "inventory" / "lab" / "hosts.yml"


def test_another_lab_id_numbers_every_name_and_keeps_its_inventory_in_its_lab_dir():
    second = lab.LabId(2)
    assert (second.host_name(1), second.host_ip(16), second.subnet) == ("lab2-h1", "10.77.2.26", "10.77.2.0/24")
    assert (second.bridge, second.veth(16), second.default_dir) == ("biv100-lab2", "biv100-2h16", "/tmp/biv100-lab2")
    assert second.inventory_path(Path("/tmp/mine")) == Path("/tmp/mine/inventory/hosts.yml")


def test_no_two_lab_ids_share_a_name_or_an_address_and_every_interface_name_fits_the_kernel():
    seen: dict[str, tuple[int, int]] = {}
    for number in range(lab.MAX_LAB_ID + 1):
        lab_id = lab.LabId(number)
        names = {lab_id.bridge, lab_id.subnet, lab_id.default_dir}
        for index in range(1, lab.MAX_HOSTS + 1):
            names |= {lab_id.host_name(index), lab_id.host_ip(index), lab_id.veth(index)}
            assert len(lab_id.veth(index)) <= 15 and len(lab_id.bridge) <= 15
        for name in names:
            assert seen.setdefault(name, (number, 0))[0] == number, f"{name}: lab {seen[name][0]} and lab {number}"
        # A lab's names are recognised as a lab's, whichever its id.
        assert lab.LAB_BRIDGE.fullmatch(lab_id.bridge) and lab.LAB_NETNS.fullmatch(lab_id.host_name(16))


@pytest.mark.parametrize("text", ["100", "-1", "two"])
def test_a_lab_id_outside_0_to_99_is_refused_naming_it(monkeypatch, text):
    monkeypatch.setenv(lab.LAB_ID_ENV, text)
    with pytest.raises(lab.LabError, match=f"{text!r}|not {text}"):
        lab.LabId.resolve()


def test_the_environment_picks_the_lab_id_and_its_default_lab_dir(monkeypatch):
    monkeypatch.setenv(lab.LAB_ID_ENV, "3")
    monkeypatch.delenv(lab.LAB_DIR_ENV, raising=False)
    assert lab.LabId.resolve() == lab.LabId(3) and lab.LabId.resolve(5) == lab.LabId(5)
    assert lab.resolve_lab_dir() == Path("/tmp/biv100-lab3")


def test_gpu_counts_name_hosts_with_or_without_their_labs_prefix():
    assert lab._gpu_counts(3, {"h2": 2, "lab-h1": 8, "lab4-h3": 0}) == [8, 2, 0]
    with pytest.raises(lab.LabError, match="h1 to h3"):
        lab._gpu_counts(3, {"lab4-h4": 2})


def test_down_on_a_lab_dir_with_nothing_built_leaves_another_dirs_lab_of_its_id_alone(
        monkeypatch, tmp_path, caplog):
    other = tmp_path / "other"
    other.mkdir()
    (other / "lab.json").write_text('{"state": "up", "lab_id": 0}')
    monkeypatch.delenv(lab.LAB_ID_ENV, raising=False)
    monkeypatch.setattr(lab, "MACHINE_LOCK", tmp_path / "machine.lock")
    monkeypatch.setattr(lab, "_bridge_owner", lambda lab_id: other)
    torn_down = []
    monkeypatch.setattr(lab, "_teardown", lambda layout, lab_id: torn_down.append(lab_id))
    caplog.set_level("INFO")
    lab.down(tmp_path / "empty")
    assert torn_down == []
    assert f"lab 0 is up in {other}" in caplog.text
    # The lab id named for a dir of nothing, or a dir claiming it: refused, naming where it is.
    with pytest.raises(lab.LabBusyError, match=f"built in {other}"):
        lab.down(tmp_path / "empty", lab_id=0)
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "lab.json").write_text('{"state": "up", "lab_id": 0}')
    with pytest.raises(lab.LabBusyError, match=f"built in {other}"):
        lab.down(tmp_path / "claims")
    assert torn_down == []
