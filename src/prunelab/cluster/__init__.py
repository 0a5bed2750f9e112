"""Sweeps on SLURM (and in local processes) through submitit: launchers that check their settings
before submitting, submit only unfinished runs, wait for every job and report each run that did
not complete; the outcome a launched job returns; the checks made before submission."""
