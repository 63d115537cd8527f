"""Write a JSON schema per served version of each CustomResourceDefinition given, from its
``openAPIV3Schema``, for check-jsonschema (README.md here says where the CRDs came from).

What changes from the CRD's schema: descriptions are dropped (size), and every object that lists
its ``properties`` and neither sets ``additionalProperties`` nor
``x-kubernetes-preserve-unknown-fields`` gets ``additionalProperties: false`` — the API server
prunes (and with kubectl's default strict field validation, refuses) an unknown field there,
and a misspelt field is what a check should catch. A ``pattern`` with Go's inline ``(?i)`` flag,
which ECMA-262 regular expressions (JSON schema's) do not have, is dropped (``DROPPED_PATTERNS``
counts them: those fields' case-insensitive enums go unchecked). The ``x-kubernetes-*`` keywords stay (JSON
schema ignores them); CEL rules (``x-kubernetes-validations``) are not checked.

    python tests/deploy/schemas/crd_to_jsonschema.py CRD.yaml... --out tests/deploy/schemas
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml


class Loader(yaml.SafeLoader):
    """YAML 1.1 reads a bare ``=`` (a matcher's matchType) as the ``value`` tag: a string here."""


Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


DROPPED_PATTERNS: list[str] = []


def _kept(key: str, value: Any) -> bool:
    if key == "description" and isinstance(value, str):
        return False
    if key == "pattern" and isinstance(value, str) and "(?i)" in value:
        DROPPED_PATTERNS.append(value)
        return False
    return True


def strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: strict(v) for k, v in node.items() if _kept(k, v)}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def schemas(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """File name (``kind-version.json``, lower case) -> JSON schema, for each served version."""
    kind = crd["spec"]["names"]["kind"]
    out = {}
    for version in crd["spec"]["versions"]:
        if not version.get("served", True):
            continue
        schema = strict(version["schema"]["openAPIV3Schema"])
        schema["$schema"] = "http://json-schema.org/draft-07/schema#"
        schema["title"] = f"{crd['spec']['group']}/{version['name']} {kind}"
        out[f"{kind.lower()}-{version['name']}.json"] = schema
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("crds", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    for path in args.crds:
        for name, schema in schemas(yaml.load(path.read_text(), Loader=Loader)).items():
            (args.out / name).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
            print(args.out / name)
    print(f"{len(DROPPED_PATTERNS)} patterns with (?i) dropped")


if __name__ == "__main__":
    main()
