import json

from click.testing import CliRunner

from wan_trt.cli import main


def test_stream_command_matches_reference(tmp_path):
    res = CliRunner().invoke(main, ["stream", "--config", "gta_drive-small", "--blocks", "8", "--reference",
                                    "--device", "cpu", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["reference_match"] and len(report["reference"]) == 8
    assert (tmp_path / "latents.pt").is_file()
