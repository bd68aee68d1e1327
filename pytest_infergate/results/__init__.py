"""Results of a run: typed records with a Status, the run that holds them, and the one summary formatter used by
the terminal summary and `infergate summary`."""

from pytest_infergate.results.records import (
                                              RESULT_PROPERTY,
                                              GoldenRecord,
                                              PerfRecord,
                                              QualityRecord,
                                              Record,
                                              record_from_dict,
)
from pytest_infergate.results.run import RunResults
from pytest_infergate.status import Status

__all__ = ["RESULT_PROPERTY", "GoldenRecord", "PerfRecord", "QualityRecord", "Record", "RunResults", "Status",
           "record_from_dict"]
