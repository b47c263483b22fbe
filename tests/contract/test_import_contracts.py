"""The import-linter contracts (pyproject.toml, docs/architecture.md §14) name every service and every package, so a
new room cannot slip outside them: `lint-imports` only checks the modules a contract names."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return {c["name"]: c for c in config}


def test_every_service_is_in_the_independence_contract() -> None:
    services = {f"taugrid_services.{d.name}" for d in (ROOT / "services").iterdir() if (d / "__main__.py").exists()}
    assert set(_contracts()["services are independent"]["modules"]) == services  # type: ignore[arg-type]


def test_every_package_of_the_library_has_a_layer() -> None:
    layers = _contracts()["layers of the library"]["layers"]
    named = {m.strip() for layer in layers for m in str(layer).split("|")}  # type: ignore[attr-defined]
    lib = ROOT / "libs" / "taugrid"
    rooms = {f"taugrid.{p.stem}" for p in lib.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert rooms - named == set()


def test_only_the_bus_adapter_imports_nats() -> None:
    nats = _contracts()["nats only in taugrid.bus"]
    assert (nats["type"], nats["forbidden_modules"], nats["ignore_imports"]) == (
        "forbidden", ["nats"], ["taugrid.bus.** -> nats"])
    assert set(nats["source_modules"]) == {"taugrid", "taugrid_services"}  # type: ignore[arg-type]


def test_no_package_of_either_root_may_hold_an_import_circle() -> None:
    circles = _contracts()["no import circles"]
    assert circles["type"] == "acyclic_siblings"
    assert set(circles["ancestors"]) == {"taugrid", "taugrid_services"}  # type: ignore[arg-type]


def test_no_service_imports_the_command_line() -> None:
    cli = _contracts()["services never import the command line"]
    assert (cli["type"], cli["source_modules"], cli["forbidden_modules"]) == (
        "forbidden", ["taugrid_services"], ["taugrid.cli"])


def test_every_service_but_the_local_clusters_own_is_kept_from_the_local_backend() -> None:
    services = {f"taugrid_services.{d.name}" for d in (ROOT / "services").iterdir() if (d / "__main__.py").exists()}
    local = _contracts()["the local backend only in its own service"]
    assert (local["type"], local["forbidden_modules"]) == ("forbidden", ["taugrid.local"])
    assert set(local["source_modules"]) == services - {"taugrid_services.local_cluster"}  # type: ignore[arg-type]


def test_the_health_library_knows_no_backend() -> None:
    health = _contracts()["health knows no backend"]
    assert (health["source_modules"], health["forbidden_modules"]) == (["taugrid.health"], ["taugrid.local",
                                                                                            "taugrid.kube"])
