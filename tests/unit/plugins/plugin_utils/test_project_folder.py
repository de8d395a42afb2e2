"""The -i argument a command printed for the team names their run's inventory with."""

from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import inventory_argument


def test_an_inventory_inside_the_project_is_named_as_the_team_types_it(tmp_path):
    config = tmp_path / "ansible.cfg"
    (tmp_path / "inventory" / "biv100").mkdir(parents=True)

    assert inventory_argument([str(tmp_path / "inventory" / "biv100")], str(config)) == "inventory/biv100"
    assert inventory_argument([str(tmp_path / "inventory" / "biv100" / "hosts.yml")],
                              str(config)) == "inventory/biv100/hosts.yml"


def test_an_inventory_outside_the_project_keeps_its_whole_path_and_several_are_each_named(tmp_path):
    config = tmp_path / "project" / "ansible.cfg"
    elsewhere = tmp_path / "fleets" / "east.yml"

    assert inventory_argument([str(elsewhere)], str(config)) == str(elsewhere)
    assert inventory_argument([str(tmp_path / "project" / "inventory" / "a"), str(elsewhere)],
                              str(config)) == f"inventory/a -i {elsewhere}"


def test_a_host_list_or_no_inventory_is_left_for_the_team_to_name(tmp_path):
    config = str(tmp_path / "ansible.cfg")
    assert inventory_argument(["h1,h2,"], config) == "<inventory>"
    assert inventory_argument([str(tmp_path / "inventory"), "h1,"], config) == "<inventory>"
    assert inventory_argument([], config) == inventory_argument(None, config) == "<inventory>"
