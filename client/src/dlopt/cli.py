"""The `dlopt` command: log in, upload models, start and follow tuning runs, download the tuned module."""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import __version__, config
from .client import Client, Json
from .errors import (
    EXIT_AUTH,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STOPPED,
    EXIT_USAGE,
    DloptError,
    NotLoggedIn,
    UsageError,
)
from .progress import RunProgress

EPILOG = f"""\
exit codes:
  {EXIT_OK}  done
  {EXIT_REFUSED}  the server refused the request (400, 409, 429, 5xx) or could not be reached, or the run failed
  {EXIT_USAGE}  usage error: bad arguments, an ambiguous name, a file that exists
  {EXIT_AUTH}  not logged in, a bad or revoked token, or not allowed (401, 403)
  {EXIT_NOT_FOUND}  no such model, run or team among yours (404)
  {EXIT_STOPPED}  a run followed with --wait was paused or cancelled

--json prints machine-readable output on stdout (progress and messages go to stderr).
`dlopt login` saves the URL and token to $XDG_CONFIG_HOME/dlopt/config.json (default ~/.config/dlopt/,
mode 0600); DLOPT_URL and DLOPT_TOKEN override them."""

Handler = Callable[[argparse.Namespace, "Output"], int]


class Output:
    """Text for people or JSON for programs, on stdout; messages on stderr."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, data: Any, text: str | list[str]) -> None:
        if self.as_json:
            print(json.dumps(data, indent=2, default=str))
        else:
            print(text if isinstance(text, str) else "\n".join(text))

    @staticmethod
    def note(message: str) -> None:
        print(message, file=sys.stderr)


def _client() -> Client:
    return Client.from_config()


def _ms(seconds: Any) -> str:
    return f"{seconds * 1e3:.4f}" if isinstance(seconds, (int, float)) and seconds else "-"


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def _run_id(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a run id is a number, not {text!r}")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("expected seconds between 0 and 3600")
    return value


# --- login --------------------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace, out: Output) -> int:
    url = args.url or os.environ.get("DLOPT_URL") or input("Server URL: ").strip()
    token = args.token or os.environ.get("DLOPT_TOKEN") or ""
    if not token:
        if sys.stdin.isatty():
            token = getpass.getpass("API token (dashboard: Settings > API tokens): ")
        else:  # `echo $TOKEN | dlopt login URL`: keeps the token out of the process list and shell history
            token = sys.stdin.readline()
    token = token.strip()
    if not token:
        raise NotLoggedIn("No token given.")
    client = Client(url, token)
    host = urllib.parse.urlsplit(client.url).hostname or ""
    if client.url.startswith("http://") and host not in ("localhost", "127.0.0.1", "::1"):
        out.note(f"warning: {client.url} is plain http: the token travels unencrypted.")
    me = client.me()  # a bad token is refused here (exit 3) and nothing is saved
    path = config.save(config.Credentials(url=client.url, token=token))
    teams = ", ".join(f"{t['name']} ({t['role']})" for t in me.get("teams", [])) or "none yet"
    out.emit({"url": client.url, "username": me["username"], "teams": me.get("teams", []), "config": str(path)},
             f"Logged in to {client.url} as {me['username']}; teams: {teams}. Saved to {path} (mode 0600).")
    return EXIT_OK


# --- models -------------------------------------------------------------------------------------------

MODEL_FIELDS = ["id", "team_name", "name", "state", "description", "file_size", "sha256", "opset", "producer",
                "inputs", "outputs", "batch_size", "gflops", "param_count", "conv_count", "linear_count",
                "num_tuning_tasks", "error_code", "error_message", "created_at"]


def _model_lines(model: Json) -> list[str]:
    return [f"{key:<17} {json.dumps(model[key]) if isinstance(model.get(key), (list, dict)) else model[key]}"
            for key in MODEL_FIELDS if key in model and model[key] not in ("", None)]


def _upload(client: Client, path: str, team: str, name: str | None, description: str, interval: float,
            out: Output) -> Json:
    model = client.upload_model(path, team=team, name=name, description=description)
    if model["state"] == "validating":
        out.note(f"Model {model['id']} ({model['name']}) uploaded; validating on the server...")
        model = client.wait_model(model["id"], interval=interval)
    if model["state"] == "invalid":
        raise DloptError(f"Model {model['id']} ({model['name']}) is invalid: {model.get('error_message')} "
                         f"({model.get('error_code')}).")
    return model


def cmd_models_upload(args: argparse.Namespace, out: Output) -> int:
    client = _client()
    if args.no_wait:
        model = client.upload_model(args.file, team=args.team, name=args.name, description=args.description)
    else:
        model = _upload(client, args.file, args.team, args.name, args.description, args.interval, out)
    out.emit(model, [(f"Model {model['id']} {model['name']} uploaded to {model['team_name']}: {model['state']}, "
                      f"{_num(model.get('gflops'))} GFLOPs, {model.get('param_count')} parameters."),
                     f"Tune it: dlopt tune {model['id']} --trials 256 --wait"])
    return EXIT_OK


def cmd_models_list(args: argparse.Namespace, out: Output) -> int:
    models = _client().models(team=args.team, name=args.name, limit=args.limit)
    rows = [[m["id"], m["team_name"], m["name"], m["state"], _num(m.get("gflops"), "{:.3f}"), m.get("param_count"),
             m.get("num_tuning_tasks") or "-", str(m["created_at"])[:19]] for m in models]
    out.emit(models, _table(["ID", "TEAM", "NAME", "STATE", "GFLOPS", "PARAMS", "TASKS", "CREATED"], rows)
             if models else "No models.")
    return EXIT_OK


def cmd_models_show(args: argparse.Namespace, out: Output) -> int:
    model = _client().model(args.model, team=args.team)
    out.emit(model, _model_lines(model))
    return EXIT_OK


# --- runs ---------------------------------------------------------------------------------------------


def _run_lines(run: Json) -> list[str]:
    lines = [f"Run {run['id']}: {run['model_name']} (model {run['model']}) {run['status']}"
             + (f", {run['requested_action']} requested" if run.get("requested_action") else "")
             + (f", number {run['queue_position']} waiting for a run slot of its team"
                if run.get("queue_position") else ""),
             f"  target {json.dumps(run['target'])}, mode {run['measurement_mode']}, DOP {run['dop']}"
             + (", Trimmer" if run.get("trimmer") else ""),
             (f"  trials {run['trials_done']}/{run['max_trials']}, wall {_num(run.get('wall_seconds'), '{:.1f}')} s, "
              f"final DOP {run.get('final_dop') or '-'}"
              )]
    if run.get("tuned_latency_s"):
        lines.append(f"  latency (compiled, median of repeats): tuned {_spread(run, 'tuned_latency')} vs untuned "
                     f"{_ms(run.get('untuned_latency_s'))} ms ({_num(run.get('speedup'))}x)"
                     + ("" if run.get("outputs_match") is None else f", outputs match: {run['outputs_match']}"))
    if run.get("ort_latency_s"):
        lines.append(f"  onnxruntime {_spread(run, 'ort_latency')}, tuned/onnxruntime {_num(run.get('ratio_to_ort'))}")
    if run.get("deploy_verdict"):
        lines.append(f"  {run['deploy_verdict']}")
    if run.get("stop_reason") and run["status"] == "succeeded":
        lines.append(f"  {run['stop_reason']}")
    if run.get("estimated_latency_s"):
        lines.append(f"  estimate (sum of per-task bests, not measured end to end): "
                     f"{_ms(run['estimated_latency_s'])} ms")
    if run.get("checkpoint_note"):
        lines.append(f"  compiled checkpoint: {run['checkpoint_note']}")
    if run.get("estimate_gap"):
        lines.append(f"  {run['estimate_gap']['note']}")
    if run.get("energy_kwh"):
        lines.append(f"  energy {run['energy_kwh']:.6f} kWh ({run.get('energy_source') or 'modeled'}), "
                     f"{_num(run.get('carbon_g'))} gCO2e")
    for key, label in (("stop_reason", "stopped"), ("error", "error")):
        if run.get(key):
            lines.append(f"  {label}: {run[key]}")
    return lines


def _spread(run: Json, name: str) -> str:
    """"median ms (IQR x ms)" of `name`_s and `name`_iqr_s, as the run page prints it."""
    iqr = run.get(f"{name}_iqr_s")
    return f"{_ms(run[f'{name}_s'])} ms" + (f" (IQR {iqr * 1e3:.4f} ms)" if isinstance(iqr, (int, float)) else "")


def _finish(run: Json, out: Output) -> int:
    """Report how a followed run stopped; its exit code."""
    run_id, done, total = run["id"], run.get("trials_done", 0), run.get("max_trials", 0)
    status = run["status"]
    if status == "succeeded":
        out.emit(run, [*_run_lines(run), f"Download the deployment package: dlopt download {run_id}"])
        return EXIT_OK
    out.emit(run, _run_lines(run))
    if status == "failed":
        out.note(f"Run {run_id} failed: {run.get('error') or 'the server recorded no reason'}. "
                 f"Details: dlopt runs show {run_id}")
        return EXIT_REFUSED
    reason = run.get("error") or run.get("stop_reason") or ""
    if status == "paused":
        # the server records a reason when it paused the run itself (e.g. the task broker was down)
        why = reason.rstrip(".") if reason else ("someone paused it (the dashboard or `dlopt runs pause`)")
        out.note(f"Run {run_id} was paused at {done}/{total} trials: {why}. "
                 f"Resume it with: dlopt runs resume {run_id} --wait")
    else:
        out.note(f"Run {run_id} was cancelled at {done}/{total} trials" + (f": {reason.rstrip('.')}." if reason else "."))
    return EXIT_STOPPED


def _follow(client: Client, run: Json, interval: float, out: Output) -> int:
    bar = RunProgress(sys.stderr)
    try:
        final = client.wait(run["id"], interval=interval, on_update=bar.update)
    except KeyboardInterrupt:
        bar.close()
        out.note(f"Stopped following run {run['id']}; it goes on on the server "
                 f"(dlopt runs show {run['id']} --wait follows it again, dlopt runs cancel {run['id']} stops it).")
        return 130
    bar.close()
    return _finish(final, out)


def _target(text: str | None) -> Json | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = {"kind": text}  # `--target cuda`
    if not isinstance(value, dict):
        raise UsageError('--target is a TVM target as JSON, e.g. \'{"kind": "llvm", "num-cores": 4}\', or a kind.')
    return value


def cmd_tune(args: argparse.Namespace, out: Output) -> int:
    client = _client()
    model_ref: str = args.model
    if model_ref.endswith(".onnx") or Path(model_ref).is_file():
        if not args.team:
            raise UsageError("--team is required to upload an ONNX file.")
        model_ref = str(_upload(client, model_ref, args.team, None, "", args.interval, out)["id"])
    run = client.tune(model_ref, trials=args.trials, minutes=args.minutes, team=args.team,
                      trials_per_round=args.trials_per_round,
                      target=_target(args.target), mode=args.mode, dop=args.dop, threads=args.threads,
                      seed=args.seed, trimmer=args.trimmer)
    budget = f"{run['max_trials']} trials" + (f" or {run['max_minutes']} min" if run.get("max_minutes") else "")
    out.note(f"Run {run['id']}: {run['model_name']} on {json.dumps(run['target'])}, {budget}, "
             f"mode {run['measurement_mode']}, DOP {run['dop']}: {run['status']}")
    if args.wait:
        return _follow(client, run, args.interval, out)
    out.emit(run, f"Follow it: dlopt runs show {run['id']} --wait")
    return EXIT_OK


def cmd_runs_list(args: argparse.Namespace, out: Output) -> int:
    runs = _client().runs(team=args.team, model=args.model, status=args.status, limit=args.limit)
    rows = [[r["id"], r["model_name"], r["status"], f"{r['trials_done']}/{r['max_trials']}", r["measurement_mode"],
             r["dop"], _ms(r.get("tuned_latency_s")), _num(r.get("speedup")), str(r["created_at"])[:19]]
            for r in runs]
    out.emit(runs, _table(["ID", "MODEL", "STATUS", "TRIALS", "MODE", "DOP", "TUNED MS", "SPEEDUP", "CREATED"], rows)
             if runs else "No runs.")
    return EXIT_OK


def cmd_runs_show(args: argparse.Namespace, out: Output) -> int:
    client = _client()
    run = client.run(args.run)
    if args.wait:
        return _follow(client, run, args.interval, out)
    out.emit(run, _run_lines(run))
    return EXIT_OK


def _control(verb: str) -> Handler:
    def handler(args: argparse.Namespace, out: Output) -> int:
        client = _client()
        run = getattr(client, verb)(args.run)
        if getattr(args, "wait", False):
            out.note(f"Run {run['id']} {run['status']}.")
            return _follow(client, run, args.interval, out)
        extra = f", {run['requested_action']} requested (it stops between rounds)" if run.get("requested_action") else ""
        out.emit(run, f"Run {run['id']} {run['status']}{extra}.")
        return EXIT_OK
    return handler


COMPARE_ROWS: list[tuple[str, Callable[[Json], str]]] = [
    ("model", lambda r: str(r["model_name"])),
    ("status", lambda r: str(r["status"])),
    ("mode", lambda r: str(r["measurement_mode"])),
    ("DOP (final)", lambda r: f"{r['dop']} ({r.get('final_dop') or '-'})"),
    ("Trimmer", lambda r: "on" if r.get("trimmer") else "off"),
    ("trials", lambda r: f"{r['trials_done']}/{r['max_trials']}"),
    ("wall s", lambda r: _num(r.get("wall_seconds"), "{:.1f}")),
    ("tuned ms", lambda r: _ms(r.get("tuned_latency_s"))),
    ("untuned ms", lambda r: _ms(r.get("untuned_latency_s"))),
    ("speedup", lambda r: _num(r.get("speedup"))),
    ("tuned/onnxruntime", lambda r: _num(r.get("ratio_to_ort"))),
    ("energy kWh", lambda r: _num(r.get("energy_kwh"), "{:.6f}")),
    ("carbon gCO2e", lambda r: _num(r.get("carbon_g"))),
    ("trials saved", lambda r: str(r.get("trials_saved") or 0)),
]


def cmd_runs_compare(args: argparse.Namespace, out: Output) -> int:
    runs = _client().compare(args.runs)
    rows = [[label, *(fmt(r) for r in runs)] for label, fmt in COMPARE_ROWS]
    out.emit(runs, _table(["", *(f"run {r['id']}" for r in runs)], rows))
    return EXIT_OK


def cmd_download(args: argparse.Namespace, out: Output) -> int:
    got = _client().download(args.run, args.output, overwrite=args.force, module_only=args.module_only)
    what = "tuned module" if args.module_only else "deployment package"
    usage = [] if args.module_only else [
        "Use it:", f"  unzip {got.path} -d run{args.run}-package", "  pip install apache-tvm numpy",
        f"  python run{args.run}-package/run.py"]
    out.emit({"run": args.run, "path": str(got.path), "bytes": got.size, "deploy_verdict": got.deploy_verdict},
             [f"Saved run {args.run}'s {what} to {got.path} ({got.size:,} bytes).",
              *([got.deploy_verdict] if got.deploy_verdict else []), *usage])
    return EXIT_OK


# --- parser -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # --json works before or after the command: SUPPRESS keeps a subcommand's default from hiding the main one
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                           help="machine-readable output on stdout")
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--wait", action="store_true",
                         help="follow the run with a progress bar until it succeeds, fails, or is paused/cancelled")
    waiting.add_argument("--interval", type=_seconds, default=2.0, help="seconds between polls (default 2)")

    parser = argparse.ArgumentParser(prog="dlopt", description="Client of a dlopt server: upload ONNX models, tune "
                                     "them with TVM, follow runs, download the tuned module.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"dlopt {__version__}")
    parser.add_argument("--json", action="store_true", default=False, help="machine-readable output on stdout")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(container: Any, name: str, handler: Handler, help_text: str,
                parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = container.add_parser(name, help=help_text, description=help_text, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   parents=[json_flag, *parents])
        sub.set_defaults(handler=handler)
        return sub

    login = command(commands, "login", cmd_login, "save the server URL and an API token (checked first)")
    login.add_argument("url", nargs="?", help="the server, e.g. https://dlopt.example.com")
    login.add_argument("--token", help="API token (default: prompted, or read from stdin when it is not a terminal)")

    models = commands.add_parser("models", help="upload, list and show models").add_subparsers(
        title="models commands", metavar="COMMAND")
    upload = command(models, "upload", cmd_models_upload, "upload and validate an ONNX model")
    upload.add_argument("file", help="an .onnx file")
    upload.add_argument("--team", required=True, help="team slug, name or id")
    upload.add_argument("--name", help="model name (default: the file name without .onnx)")
    upload.add_argument("--description", default="")
    upload.add_argument("--no-wait", action="store_true", help="return at once while a large file validates")
    upload.add_argument("--interval", type=_seconds, default=2.0, help=argparse.SUPPRESS)
    listing = command(models, "list", cmd_models_list, "models of your teams, newest first")
    listing.add_argument("--team", help="team slug, name or id")
    listing.add_argument("--name", help="names containing this")
    listing.add_argument("--limit", type=_positive, default=50)
    show = command(models, "show", cmd_models_show, "a model and its graph features")
    show.add_argument("model", help="model id or name")
    show.add_argument("--team", help="team slug, name or id (when two of your teams have the name)")

    tune = command(commands, "tune", cmd_tune, "start a tuning run", parents=[waiting])
    tune.add_argument("model", help="model id or name, or an .onnx file to upload first (needs --team)")
    tune.add_argument("--trials", type=_positive, required=True, help="total trial budget")
    tune.add_argument("--minutes", type=_positive,
                      help="time budget: tuning finishes after this many minutes, or the trials, whichever comes "
                           "first, and the best schedules found are compiled")
    tune.add_argument("--team", help="team slug, name or id")
    tune.add_argument("--trials-per-round", type=_positive)
    tune.add_argument("--target", help='TVM target as JSON (\'{"kind": "llvm", "num-cores": 4}\') or a kind')
    tune.add_argument("--mode", choices=["doppler", "stock"], help="measurement mode (server default: doppler)")
    tune.add_argument("--dop", help="'auto' or a fixed degree of parallelism")
    tune.add_argument("--threads", type=_positive)
    tune.add_argument("--seed", type=int)
    tune.add_argument("--trimmer", action="store_true", help="enable Trimmer")

    runs = commands.add_parser("runs", help="list, show, pause, resume, cancel and compare runs").add_subparsers(
        title="runs commands", metavar="COMMAND")
    listing = command(runs, "list", cmd_runs_list, "runs of your teams, newest first")
    listing.add_argument("--team", help="team slug, name or id")
    listing.add_argument("--model", help="model id or name")
    listing.add_argument("--status", choices=["queued", "running", "paused", "succeeded", "failed", "cancelled"])
    listing.add_argument("--limit", type=_positive, default=50)
    show = command(runs, "show", cmd_runs_show, "a run's progress and results", parents=[waiting])
    show.add_argument("run", type=_run_id)
    for verb, text in (("pause", "pause a run (a running one stops between rounds)"),
                       ("resume", "resume a paused run"), ("cancel", "cancel a run")):
        control = command(runs, verb, _control(verb), text, parents=[waiting] if verb == "resume" else [])
        control.add_argument("run", type=_run_id)
    compare = command(runs, "compare", cmd_runs_compare, "runs side by side")
    compare.add_argument("runs", type=_run_id, nargs="+", metavar="RUN")

    download = command(commands, "download", cmd_download,
                       "download a run's deployment package (.zip: module, manifest.json, run.py)")
    download.add_argument("run", type=_run_id)
    download.add_argument("-o", "--output",
                          help="file or directory (default ./run<ID>-package.zip, or ./run<ID>-tuned.so)")
    download.add_argument("--module-only", action="store_true", help="only the compiled module (.so)")
    download.add_argument("--force", action="store_true", help="overwrite an existing file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 for a usage error, 0 for --help / --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    out = Output(as_json=args.json)
    try:
        return handler(args, out)
    except DloptError as exc:
        print(f"dlopt: {exc}", file=sys.stderr)
        if out.as_json:
            error = exc.as_dict() if hasattr(exc, "as_dict") else {"detail": str(exc)}
            print(json.dumps({"error": error, "exit_code": exc.exit_code}, indent=2))
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # a local file: the model to upload, the download's destination, the config
        print(f"dlopt: {exc}", file=sys.stderr)
        return EXIT_REFUSED


__all__ = ["EPILOG", "build_parser", "main"]
