"""The user tools the README names: `bin/train`, `bin/test`, `bin/setup.sh`, and the scripts
`python bin/<name>.py` runs (reproduce, report, compare_runs, curves, benchmark,
export_pretrained, compare_results). A package only so that the tests import the scripts as
`bin.<name>`, as any module, from the repository root; it imports nothing. The maintainer tools
are in tools/.
"""
