"""Pages generated from the code stay in sync with it."""

import dataclasses
import re
from pathlib import Path

from halo_core.trainers.arguments import HaloArguments

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_page_lists_exactly_halos_fields():
    page = (ROOT / "agent-docs" / "configuration.md").read_text()
    table = page.split("<!-- halo-fields")[1].split("\n\n")[0]
    documented = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert documented == [f.name for f in dataclasses.fields(HaloArguments)]
