"""``planner clusters``: the shipped cluster presets."""

from __future__ import annotations

import click


@click.command("clusters")
@click.option("--json", "as_json", is_flag=True, help="Print the presets as one JSON document on stdout.")
def clusters(as_json: bool) -> None:
    """List the cluster presets (use a name with --cluster, or write your own cluster JSON)."""
    from planner.cluster import PRESET_DIR, list_presets, preset_description
    from planner.render.search import print_clusters

    presets = list_presets()
    descriptions = {c.name: preset_description(c.name) for c in presets}
    print_clusters(presets, descriptions)
    if as_json:
        from planner.cli import emit_json

        emit_json({"kind": "clusters", "version": 1, "folder": str(PRESET_DIR),
                   "clusters": [dict(c.to_dict(), description=descriptions[c.name]) for c in presets]})
