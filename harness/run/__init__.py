"""Where a level is run. One way down, no module importing back up:

- `sweep.py`: a sweep's flow: checks, server (launched or attached), the run's record, the up-front
  estimate, each planned level run and stored as it finishes, evaluations, the run finished;
- `capacity.py`: the capacity search, which chooses the sweep's levels as it goes;
- `level_run.py`: the running of one planned level (`Level`, `LevelRunner`): requests, load, watch,
  figures, validity; `level_work.py`: what a level sends, by kind of workload; `profiled.py`: the
  --profile-level pass;
- `config.py`: what a sweep is asked (`SweepConfig`);
- `jobrun.py`, `fleet.py`: suite jobs run here, or dispatched to a fleet.
"""
