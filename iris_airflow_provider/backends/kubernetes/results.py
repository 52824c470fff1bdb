"""How a job's result leaves its pod: no new permission, no shared disk, just the container's log.

A pod shares no disk with the backend, and reading a file out of it would need ``pods/exec``. So
the container's command is wrapped (``wrapped_command``): a POSIX shell runs the job, forwards
SIGTERM and SIGINT to it, and once it has exited writes the file at ``$IRIS_RESULT`` (an emptyDir
at ``/iris/result``) to its output, each line framed by ``RESULT_MARK``, then exits with the
job's code. The backend reads the frame from replica 0's log once the Job is complete
(``extract_result``), and the log relay leaves its lines out (``is_result_line``). The shell
stops after ``MAX_RESULT_BYTES`` and says so (``too-large``), so a huge file never floods the log.

Limits: the image needs ``/bin/sh`` (a job with no ``command`` runs the image's entrypoint
unwrapped and hands nothing back); a line of the job's own output starting with the mark is
taken for the frame's; the log must still be there (``ttlSecondsAfterFinished`` removes it).

Pure: the backend reads the log and hands the text in.
"""

from __future__ import annotations

from collections.abc import Sequence

from iris_airflow_provider.core.job_result import MAX_RESULT_BYTES, RESULT_ENV, ResultError, parse_result, too_large

RESULT_DIR = "/iris/result"
RESULT_PATH = f"{RESULT_DIR}/result.json"
RESULT_VOLUME = "iris-result"
RESULT_MARK = "##iris-result-7c3f9a##"
BEGIN = f"{RESULT_MARK} begin"
LINE = f"{RESULT_MARK}|"
END = f"{RESULT_MARK} end"
TOO_LARGE = f"{RESULT_MARK} too-large"

# $1.. is the job's command. The job runs in the background so that this shell, the container's
# first process, can forward the signals Kubernetes sends it (a first process has no default
# handlers); `wait` returns early when a trap runs, hence the loop until the job is gone.
WRAPPER = f"""\
"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM
trap 'kill -INT "$child" 2>/dev/null' INT
while :; do
  wait "$child"
  code=$?
  kill -0 "$child" 2>/dev/null || break
done
if [ -f "${RESULT_ENV}" ]; then
  size=0
  printf '%s\\n' '{BEGIN}'
  while IFS= read -r line || [ -n "$line" ]; do
    size=$((size + ${{#line}} + 1))
    if [ "$size" -gt {MAX_RESULT_BYTES + 1} ]; then
      printf '%s\\n' '{TOO_LARGE}'
      exit "$code"
    fi
    printf '%s%s\\n' '{LINE}' "$line"
  done < "${RESULT_ENV}"
  printf '%s\\n' '{END}'
fi
exit "$code"
"""


def wrapped_command(command: Sequence[str]) -> list[str]:
    """The container's command: ``command`` run by the wrapper that hands its result back."""
    return ["/bin/sh", "-c", WRAPPER, "iris-job", *command]


def is_result_line(line: str) -> bool:
    """Whether a line of output belongs to a result's frame (left out of the relayed output)."""
    return line.startswith(RESULT_MARK)


def extract_result(lines: Sequence[str]) -> str | None:
    """The result in the last frame of these output lines (timestamps removed), checked; None when
    the job wrote none. ResultError when it is too large, not JSON, or its frame is not whole."""
    begin = max((index for index, line in enumerate(lines) if line == BEGIN), default=None)
    if begin is None:
        return None
    body: list[str] = []
    for line in lines[begin + 1 :]:
        if line == END:
            return parse_result("\n".join(body).encode("utf-8"))
        if line == TOO_LARGE:
            raise too_large()
        if line.startswith(LINE):
            body.append(line[len(LINE) :])
    raise ResultError(
        f"The job's result (the file at ${RESULT_ENV}) could not be read whole from replica 0's log "
        "(the log was cut or rotated)"
    )
