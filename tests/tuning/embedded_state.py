"""Helper run as a subprocess by test_embedded_recovery: talks to the *embedded* deployment's SQLite
database (DLOPT_VAR_DIR, no DATABASE_URL), which the pytest database is not.

    python -m tests.tuning.embedded_state setup   -> creates a user, team, tiny model and a queued run; prints its id
    python -m tests.tuning.embedded_state state N -> prints the run's status, attempts, losses and measurement keys,
                                                     and its TVM database's record count and duplicates
"""
import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def main() -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from core import services as core
    from core.models import Quota
    from tests.tuning.onnx_builders import tiny_dense
    from tuning import services
    from tuning.models import Measurement, TuningRun

    if sys.argv[1] == "setup":
        user = get_user_model().objects.create_user(username="op", password="pw-op")
        team = core.create_team(name="Embedded", owner=user)
        Quota.objects.filter(team=team).update(tuning_trials_per_month=10**6, energy_kwh_per_month=10**4)
        model = core.register_model(team=team, name="tiny", data=tiny_dense(), filename="tiny.onnx", actor=user)
        run = services.start_run(actor=user, model=model, max_trials=int(sys.argv[2]), trials_per_round=4,
                                 target={"kind": "llvm", "num-cores": 1},
                                 options={"search_population": 16, "genetic_num_iters": 1, "seed": 1,
                                          "evaluator": {"number": 2, "repeat": 1, "min_repeat_ms": 1}})
        print(run.pk)
    else:
        run = TuningRun.objects.get(pk=int(sys.argv[2]))
        keys = list(Measurement.objects.filter(run=run).values_list("task__index", "candidate_key"))
        print(json.dumps({"status": run.status, "error": run.error, "attempts": run.attempts,
                          "losses": run.executor_losses, "trials_done": run.trials_done, "keys": keys,
                          "max_trials": run.max_trials, "trials_per_round": run.trials_per_round,
                          **tvm_database(run.pk)}))


def tvm_database(run_id: int) -> dict:
    """How many records the run's TVM database holds, and how many of them repeat a candidate (the same
    trace of the same workload: what two engines on one work dir write)."""
    from tuning.adapters import run_files_dir

    path = run_files_dir(run_id) / "work" / "database_tuning_record.json"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    candidates = [(workload, json.dumps(record[0], sort_keys=True)) for workload, record in lines]
    return {"tvm_records": len(candidates), "tvm_duplicates": len(candidates) - len(set(candidates))}


if __name__ == "__main__":
    main()
