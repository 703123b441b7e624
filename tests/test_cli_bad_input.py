"""Bad input: one clear line on stderr, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import pytest

# Parsing and one-line errors are the CLI's, the same whatever the store; the test about
# the store's all-or-nothing cancel runs on both backends.
pytestmark = pytest.mark.backends("sqlite")

CASES = {
    "malformed duration": (["submit", "--duration", "2hours", "--", "true"], "invalid duration"),
    "duration without unit": (["submit", "--duration", "90", "--", "true"], "invalid duration"),
    "deadline in the past": (
        ["submit", "--deadline", "2001-01-01T00:00Z", "--", "true"],
        "in the past",
    ),
    "malformed deadline": (["submit", "--deadline", "tomorrow", "--", "true"], "invalid deadline"),
    "deadline and within": (
        ["submit", "--deadline", "2999-01-01T00:00Z", "--within", "1h", "--", "true"],
        "not both",
    ),
    "more GPUs than any node": (
        ["submit", "--gpus", "5", "--", "true"],
        "needs 5 GPUs; the largest node has 4",
    ),
    "GPU range beyond any node": (["submit", "--gpus", "6-8", "--", "true"], "needs 6 GPUs"),
    "malformed GPU count": (["submit", "--gpus", "two", "--", "true"], "invalid GPU count"),
    "inverted GPU range": (["submit", "--gpus", "4-2", "--", "true"], "invalid GPU range"),
    "empty command": (["submit", "--gpus", "1"], "empty command"),
    # a value given to a flag (``--share`` takes none) would queue ``yes -- true``
    "a word before --": (["submit", "--share", "yes", "--", "true"], "'yes' before --"),
    "words before --": (
        ["submit", "python", "x.py", "--", "--lr", "3"],
        "'python' 'x.py' before -- would become the command",
    ),
    "empty command after --": (["submit", "--"], "empty command"),
    "blank command": (["submit", "--", ""], "empty command"),
    "unknown option": (["submit", "--gpu-count", "2", "--", "true"], "No such option"),
    "unknown command": (["frobnicate"], "No such command"),
    "unknown dependency": (["submit", "--after", "42", "--", "true"], "no job 42"),
    "malformed dependency": (["submit", "--after", "x", "--", "true"], "invalid job id"),
    "malformed env": (["submit", "--env", "NOVALUE", "--", "true"], "KEY=VALUE"),
    "bad env name": (["submit", "--env", "1X=2", "--", "true"], "invalid environment"),
    "missing workdir": (["submit", "--workdir", "/no/such/dir", "--", "true"], "does not exist"),
    "missing sweep file": (["submit", "--file", "/no/such.jsonl"], "cannot read"),
    "sweep plus options": (["submit", "--file", "x.jsonl", "--gpus", "2"], "with --file"),
    "unknown job to show": (["show", "7"], "no job 7"),
    "unknown job to cancel": (["cancel", "7"], "no job 7"),
    "unknown job for logs": (["logs", "7"], "no job 7"),
    "job id not a number": (["show", "abc"], "Invalid value for"),
    "missing config file": (["--config", "/no/such.toml", "ls"], "does not exist"),
    "cron without window": (["submit", "--cron", "0 2 * * *", "--", "true"], "together"),
    "malformed cron": (
        ["submit", "--cron", "at two", "--window", "8h", "--", "true"],
        "invalid cron expression",
    ),
    "cron job longer than its window": (
        ["submit", "--cron", "0 2 * * *", "--window", "1h", "--duration", "2h", "--", "true"],
        "longer than its window",
    ),
    "synthetic signal too many points": (
        ["plan", "--policy", "fifo", "--grid", "synthetic:days=3650&step=1m"],
        "more than 1,000,000",
    ),
    "planning slot too short": (
        ["plan", "--grid", "synthetic:days=30", "--slot", "0.001s"],
        "a planning slot is 1s to 1h",
    ),
    "cron that never fires": (
        ["submit", "--cron", "0 0 31 2 *", "--window", "8h", "--", "true"],
        "never fires",
    ),
    "cron window beyond a year": (
        ["submit", "--cron", "0 2 * * *", "--window", "1000000w", "--", "true"],
        "at most one year (365d)",
    ),
    "infinite cron window": (
        ["submit", "--cron", "0 2 * * *", "--window", "9" * 400 + "h", "--", "true"],
        "at most one year (365d)",
    ),
    "cron weekday out of range": (
        ["submit", "--cron", "0 2 * * 8", "--window", "8h", "--", "true"],
        "invalid weekday",
    ),
    "cron with a deadline": (
        ["submit", "--cron", "0 2 * * *", "--window", "8h", "--within", "2h", "--", "true"],
        "each occurrence plus --window",
    ),
    "unknown cron template": (["cron", "rm", "9"], "no cron template 9"),
    "slot too short": (["daemon", "--policy", "fifo", "--slot", "0.5s"], "1s to 1h"),
    "malformed slot": (["daemon", "--slot", "soon"], "invalid duration"),
    "unknown suspend mode": (["daemon", "--suspend", "pause"], "--suspend"),
    "planner without a signal": (["daemon", "--policy", "budget"], "plans with the grid"),
    "malformed budget": (["daemon", "--budget", "lots"], "invalid budget"),
    "unknown backfill mode": (["daemon", "--backfill", "aggressive"], "invalid --backfill"),
    "budget without an amount": (["budget"], "no budget"),
    "malformed report start": (["report", "--since", "yesterday"], "invalid --since"),
    # an empty --since is no "all time"; a start in the future reports nothing; past a
    # year it says the year is the limit (not "give a duration")
    "empty report start": (["report", "--since", ""], "invalid --since '': give a duration"),
    "report start in the future": (["report", "--since", "2099-01-01"], "in the future"),
    "report start too long ago": (["report", "--since", "400d"], "at most one year (365d)"),
    "report start of no time": (["report", "--since", "0d"], "longer than zero"),
    # a date whose UTC falls outside what a datetime holds (an offset past year 1 or 9999)
    "report start before year 1 in UTC": (
        ["report", "--since", "0001-01-01T00:00:00+00:01"],
        "invalid --since",
    ),
    "report start past year 9999 in UTC": (
        ["report", "--since", "9999-12-31T23:59:59-14:00"],
        "invalid --since",
    ),
    "plan without a grid source names its own flag": (  # not grid show's --source (QA)
        ["plan"],
        "no grid source: give --grid (e.g. uk, csv:PATH) or set grid.source",
    ),
    "grid show without a grid source names its own flag": (
        ["grid", "show"],
        "no grid source: give --source (e.g. uk, csv:PATH) or set grid.source",
    ),
    "plan time past year 9999 in UTC": (
        ["plan", "--at", "9999-12-31T23:59:59-14:00"],
        "invalid time",
    ),
}


@pytest.mark.parametrize("args,message", CASES.values(), ids=CASES.keys())
def test_bad_input_exits_2_with_one_line_and_writes_nothing(cli, args, message):
    proc = cli.run(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gridshift: error:") and message in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert cli.job_count() == 0


@pytest.mark.backends("sqlite", "postgresql")
def test_cancel_of_several_ids_is_all_or_nothing(cli):
    cli.submit("--", "true")
    proc = cli.run("cancel", "1", "99", check=False)
    assert proc.returncode == 2 and "no job 99" in proc.stderr
    assert cli.json("show", "1")["state"] == "queued"


def test_bad_config_file_is_one_line(cli):
    cli.home.joinpath("gridshift.toml").write_text("fake_gpus = [oops\n")
    proc = cli.run("ls", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    cli.home.joinpath("gridshift.toml").write_text("fake_gpu = 3\n")
    proc = cli.run("ls", check=False)
    assert proc.returncode == 2 and "fake_gpu" in proc.stderr


def test_unreadable_database_is_a_failure_not_a_traceback(cli):
    cli.env["GRIDSHIFT_DATABASE_URL"] = "sqlite:////proc/gridshift-cannot-live-here/x.db"
    proc = cli.run("ls", check=False)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_an_unreachable_postgresql_server_is_one_line(cli):
    from tests.helpers.waiting import free_port

    url = f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/gridshift"
    cli.env["GRIDSHIFT_DATABASE_URL"] = url
    proc = cli.run("ls", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "database error" in proc.stderr and "127.0.0.1" in proc.stderr


def test_plan_submit_needs_a_slurm_node(cli):
    cli.submit("--", "true")
    proc = cli.run("plan", "--submit", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert 'executor = "slurm"' in proc.stderr
    assert cli.json("show", "1")["state"] == "queued", "nothing handed over"


def test_a_daemon_given_a_missing_trace_refuses_to_start(cli):
    proc = cli.run("daemon", "--grid", "csv:/no/such.csv", "--until-idle", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "gridshift: error: csv: no such file '/no/such.csv'"
    )


@pytest.mark.parametrize(
    "node,message",
    [
        ('name = "s"\nexecutor = "ssh"', "an ssh node needs a host"),
        ('name = "s"\nexecutor = "ssh"\nhost = "h"\nfake_gpus = 2', "fake_gpus is for local"),
        ('name = "s"\nexecutor = "ssh"\nhost = "h"\nlost_after = "soon"', "lost_after"),
        ('name = "c"\nexecutor = "slurm"', "a slurm node needs gpus"),
        ('name = "c"\nexecutor = "slurm"\ngpus = 4\ntime_margin = -1', "time_margin"),
        ('name = "c"\nexecutor = "slurm"\ngpus = 8\ngpus_per_node = 0', "gpus_per_node"),
        (
            'name = "s"\nexecutor = "ssh"\nhost = "h"\nrendezvous_addr = "x;rm -rf /"',
            "rendezvous_addr",
        ),
    ],
)
def test_a_bad_node_is_one_line(cli, node, message):
    cli.home.joinpath("gridshift.toml").write_text(f"[[nodes]]\n{node}\n")
    proc = cli.run("nodes", check=False)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr


def test_a_slurm_node_without_slurms_commands_is_one_line(cli):
    # Slurm's commands are found in slurm_bin_dir (else fixed system directories), never
    # on the caller's PATH: a directory without them stands for a host without Slurm
    cli.home.joinpath("gridshift.toml").write_text(
        '[[nodes]]\nname = "cluster"\nexecutor = "slurm"\ngpus = 4\n'
        'slurm_bin_dir = "/nonexistent"\n'
    )
    cli.submit("--", "true")
    for args in (["daemon", "--until-idle"], ["plan", "--submit"]):
        proc = cli.run(*args, check=False)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "gridshift: error: node cluster: executor 'slurm' needs Slurm's client commands "
            "(sbatch, squeue, sacct, scancel, scontrol) in /nonexistent (slurm_bin_dir sets "
            "where)"
        ]
    assert cli.json("show", "1")["state"] == "queued", "nothing was lost"


def test_plan_on_a_grid_file_that_ends_before_now_says_what_it_covers(cli):
    """A CSV the user names that does not reach the plan's time is theirs to mend (exit 2,
    its range said); it was exit 1, as if a provider had failed."""
    trace = cli.home / "old.csv"
    trace.write_text("timestamp,carbon_intensity\n2020-01-01T00:00Z,300\n2020-01-01T01:00Z,200\n")
    proc = cli.run("plan", "--grid", f"csv:{trace}", check=False)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "its data run from 2020-01-01 00:00 to 2020-01-01 01:00 UTC" in line, line
    assert "plan --at" in line
    inside = cli.run("plan", "--grid", f"csv:{trace}", "--at", "2020-01-01T00:30Z", "--json")
    assert inside.returncode == 0
