"""Workloads: the requests a user asks for, as the reference engine and a served endpoint both take them - the
`Request` record, synthetic chat workloads and arrival processes (request.py), and real traffic read from files,
multi-turn `Session`s included (traffic.py). Below the engine and the endpoint, which never import each other; no
torch here."""

from pytest_infergate.workloads.request import (
    PASSAGE,
    QUESTIONS,
    Request,
    RequestError,
    chat_prompt_with_length,
    chat_workload,
    default_chat_workload,
    gamma_arrival_offsets,
    with_burst_arrivals,
    with_gamma_arrivals,
    with_poisson_arrivals,
)
from pytest_infergate.workloads.traffic import Session, Turn, WorkloadError, from_file, run_sessions

__all__ = ["PASSAGE", "QUESTIONS", "Request", "RequestError", "Session", "Turn", "WorkloadError",
           "chat_prompt_with_length", "chat_workload", "default_chat_workload", "from_file", "gamma_arrival_offsets",
           "run_sessions",
           "with_burst_arrivals", "with_gamma_arrivals", "with_poisson_arrivals"]
