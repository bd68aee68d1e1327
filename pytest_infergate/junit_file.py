"""pytest writes `--junitxml` straight over the previous file, so an interrupt while it writes (a cancelled CI job:
SIGTERM, which the plugin turns into an interrupt) leaves a truncated XML that the CI's test-report step then
rejects or misreads. The plugin points pytest at a temporary file beside the target and renames it once complete,
as it does for its own outputs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from _pytest.junitxml import xml_key

from pytest_infergate.atomic import plain_file_mode


class AtomicJUnitXml:
    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session):
        xml = session.config.stash.get(xml_key, None)
        if xml is None:  # no --junitxml, or an xdist worker (the controller writes it)
            return (yield)
        target = xml.logfile
        folder = os.path.dirname(os.path.abspath(target))
        os.makedirs(folder, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=os.path.basename(target) + ".", suffix=".tmp", dir=folder)
        os.close(handle)
        xml.logfile = tmp
        try:
            result = yield
            if os.path.getsize(tmp):  # junitxml wrote it whole
                os.chmod(tmp, plain_file_mode())
                os.replace(tmp, target)
            return result
        finally:
            xml.logfile = target  # the terminal's "generated xml file" line names the real file
            Path(tmp).unlink(missing_ok=True)

