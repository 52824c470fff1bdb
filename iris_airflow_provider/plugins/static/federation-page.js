/*
 * The Federation page of the Airflow UI (a plugin "react app", route /plugin/iris-federation).
 *
 * Build-less on purpose: plain JavaScript using the React, React Router and Chakra UI instances the
 * Airflow UI exposes to plugins (globalThis.React, ReactRouterDOM, ChakraUI), so it shares the UI's
 * theme (light and dark), fonts and state colours, and nothing has to be compiled on CI.
 * The UI imports this file and renders globalThis.AirflowPlugin.
 *
 * Data comes from the plugin's JSON API (iris/federation/ui/api/...), authenticated by the UI's own
 * session cookie. Jobs are paged and filtered on the server, so 10,000s of jobs stay fast.
 */
(function () {
  "use strict";

  const React = globalThis.React;
  const C = globalThis.ChakraUI;
  const Router = globalThis.ReactRouterDOM;
  const h = React.createElement;
  const { useCallback, useEffect, useRef, useState } = React;

  const PAGE_SIZE = 50;
  const REFRESH_MS = 5000;
  const BANDS = ["PRODUCTION", "PRIORITY", "INTERACTIVE", "BATCH"];
  const BAND_COLOR = { PRODUCTION: "red.500", PRIORITY: "orange.400", INTERACTIVE: "blue.500", BATCH: "teal.500" };
  const STATES = ["pending", "accepted", "running", "succeeded", "failed", "killed", "unschedulable"];
  // Airflow's own task-state colour palettes, so a job looks like the task that submitted it.
  const STATE_PALETTE = {
    pending: "queued",
    accepted: "scheduled",
    running: "running",
    succeeded: "success",
    failed: "failed",
    killed: "upstream_failed",
    unschedulable: "failed",
  };
  const HANDOFF_PALETTE = { queued: "queued", pending: "scheduled", handed_off: "deferred", rejected: "failed" };

  // API ------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function apiUrl(path, params) {
    const url = new URL("iris/federation/ui/api/" + path, document.baseURI);
    Object.entries(params || {}).forEach(([key, value]) => {
      if (value === undefined || value === null || value === "") return;
      url.searchParams.set(key, String(value));
    });
    return url.href;
  }

  async function api(path, params, method) {
    const response = await fetch(apiUrl(path, params), {
      method: method || "GET",
      credentials: "same-origin", // the UI's HttpOnly session cookie authenticates us
      headers: method === "POST" ? { "X-Iris-Federation": "ui", Accept: "application/json" } : { Accept: "application/json" },
    });
    let body = null;
    try {
      body = await response.json();
    } catch (_error) {
      body = null;
    }
    if (!response.ok) {
      const detail = body && body.detail ? body.detail : response.statusText;
      throw new ApiError(response.status, typeof detail === "string" ? detail : JSON.stringify(detail));
    }
    return body;
  }

  // Reloads every REFRESH_MS while the tab is visible; keeps the last data while reloading.
  function usePolled(load, deps) {
    const [state, setState] = useState({ data: null, error: null, loading: true });
    const generation = useRef(0);
    const reload = useCallback(() => {
      const mine = ++generation.current;
      setState((previous) => ({ ...previous, loading: true }));
      load().then(
        (data) => mine === generation.current && setState({ data, error: null, loading: false }),
        (error) => mine === generation.current && setState((previous) => ({ data: previous.data, error, loading: false })),
      );
      // eslint-disable-next-line react-hooks/exhaustive-deps
    }, deps);
    useEffect(() => {
      reload();
      const timer = setInterval(() => {
        if (!document.hidden) reload();
      }, REFRESH_MS);
      return () => clearInterval(timer);
    }, [reload]);
    return { ...state, reload };
  }

  // Formatting -----------------------------------------------------------------------------------

  function duration(ms) {
    if (ms === null || ms === undefined) return "–";
    const seconds = Math.max(0, Math.round(ms / 1000));
    if (seconds < 60) return seconds + "s";
    const minutes = Math.floor(seconds / 60);
    if (minutes < 60) return minutes + "m " + (seconds % 60) + "s";
    const hours = Math.floor(minutes / 60);
    if (hours < 48) return hours + "h " + (minutes % 60) + "m";
    return Math.floor(hours / 24) + "d " + (hours % 24) + "h";
  }

  function when(ms) {
    return ms ? new Date(ms).toLocaleString() : "–";
  }

  function bandName(wire) {
    return (wire || "").replace(/^PRIORITY_BAND_/, "").toLowerCase();
  }

  function routerPath(path) {
    // Links inside the Airflow UI are router paths (the UI's <base href> may not be "/").
    return "/" + path;
  }

  // Small pieces ---------------------------------------------------------------------------------

  function StateBadge({ state }) {
    if (!state) return h(C.Text, { color: "fg.muted" }, "–");
    return h(C.Badge, { colorPalette: STATE_PALETTE[state] || "gray", variant: "solid", "data-state": state }, state);
  }

  function HandoffBadge({ handoff }) {
    if (!handoff) return h(C.Text, { color: "fg.muted" }, "–");
    return h(C.Badge, { colorPalette: HANDOFF_PALETTE[handoff] || "gray", variant: "subtle" }, handoff.replace("_", " "));
  }

  function ErrorNote({ error }) {
    if (!error) return null;
    const text =
      error.status === 401
        ? "Your Airflow session has expired: sign in again. (" + error.message + ")"
        : error.status === 403
          ? "Not allowed: " + error.message
          : error.message;
    return h(
      C.Alert.Root,
      { status: error.status === 403 ? "warning" : "error", my: 2 },
      h(C.Alert.Indicator),
      h(C.Alert.Title, null, text),
    );
  }

  function TaskLink({ job }) {
    if (!job.task_instance_path) return h(C.Text, { color: "fg.muted" }, "–");
    const label = job.origin ? job.origin.dag_id + " › " + job.origin.task_id : "runner";
    return h(
      C.Link,
      { asChild: true, colorPalette: "blue", fontSize: "sm" },
      h(Router.Link, { to: routerPath(job.task_instance_path), title: "The Airflow task instance that submitted it" }, label),
    );
  }

  // Capacity: a stacked meter per device variant: what each band holds, and what is free --------

  function heldByBand(availability, variant) {
    const held = {};
    ((availability && availability.held_by_band) || []).forEach((entry) => {
      const band = bandName(entry.band).toUpperCase();
      const amount = Number((entry.amounts || {})[variant] || 0);
      if (amount > 0) held[band] = (held[band] || 0) + amount;
    });
    return held;
  }

  function Meter({ label, variant, availability, reserved, dimmed }) {
    const free = Number((availability.amounts || {})[variant] || 0);
    // Reserved for jobs handed off and not yet running there: not offered again until the peer's
    // reports show those jobs.
    const promoted = Math.min(free, Number((reserved || {})[variant] || 0));
    const total = Number((availability.total_amounts || {})[variant] || 0);
    const held = heldByBand(availability, variant);
    const denominator = Math.max(total, free + Object.values(held).reduce((a, b) => a + b, 0), 1);
    const segments = BANDS.filter((band) => held[band]).map((band) =>
      h(C.Box, {
        key: band,
        width: (100 * held[band]) / denominator + "%",
        bg: BAND_COLOR[band],
        title: bandName(band) + " holds " + held[band] + " " + variant,
      }),
    );
    if (promoted) {
      segments.push(
        h(C.Box, {
          key: "promoted",
          width: (100 * promoted) / denominator + "%",
          bg: "gray.400",
          title: promoted + " " + variant + " reserved for jobs handed off and not yet running there",
        }),
      );
    }
    const heldText = BANDS.filter((band) => held[band])
      .map((band) => bandName(band) + " " + held[band])
      .join(" · ");
    return h(
      C.Box,
      { mb: 2, opacity: dimmed ? 0.45 : 1 },
      h(
        C.Flex,
        { justify: "space-between", fontSize: "sm", gap: 2 },
        h(C.Text, { fontWeight: "semibold" }, variant),
        h(C.Text, { color: "fg.muted", "data-testid": "meter-text" }, free + " / " + total + " free"),
      ),
      h(
        C.Flex,
        {
          role: "meter",
          "aria-label": variant + " on " + label,
          "aria-valuemin": 0,
          "aria-valuemax": total,
          "aria-valuenow": free,
          "aria-valuetext": free + " of " + total + " " + variant + " free",
          height: "10px",
          borderRadius: "full",
          overflow: "hidden",
          bg: "bg.emphasized",
          mt: 1,
        },
        segments,
      ),
      h(
        C.Text,
        { fontSize: "xs", color: "fg.muted", mt: 1 },
        (heldText ? "held: " + heldText : "nothing held") +
          (promoted ? " · " + promoted + " reserved for jobs handed off and not yet running there" : ""),
      ),
    );
  }

  function Attributes({ attributes }) {
    const entries = Object.entries(attributes || {});
    if (!entries.length) return h(C.Text, { fontSize: "xs", color: "fg.muted" }, "advertises no attributes");
    return h(
      C.Flex,
      { wrap: "wrap", gap: 1 },
      entries.map(([key, value]) =>
        h(C.Badge, { key, variant: "outline", size: "sm", fontWeight: "normal" }, key + "=" + (value.values || []).join(",")),
      ),
    );
  }

  function BackendBlock({ owner, backend, dimmed }) {
    const availability = backend.availability;
    const variants = availability
      ? Array.from(new Set([...Object.keys(availability.total_amounts || {}), ...Object.keys(availability.amounts || {})])).sort()
      : [];
    return h(
      C.Box,
      { borderTopWidth: "1px", borderColor: "border.muted", pt: 2, mt: 2, "data-testid": "backend-" + owner + "/" + backend.backend_id },
      h(
        C.Flex,
        { justify: "space-between", align: "center", mb: 1 },
        h(C.Text, { fontWeight: "semibold", fontSize: "sm" }, backend.backend_id + (backend.kind ? " (" + backend.kind + ")" : "")),
        h(
          C.Text,
          { fontSize: "xs", color: "fg.muted" },
          backend.running_task_count + " running · " + backend.pending_task_count + " pending",
        ),
      ),
      h(Attributes, { attributes: backend.advertised_attributes }),
      backend.error ? h(C.Text, { fontSize: "sm", color: "fg.error", mt: 1 }, backend.error) : null,
      h(
        C.Box,
        { mt: 2 },
        availability
          ? variants.length
            ? variants.map((variant) =>
                h(Meter, { key: variant, label: owner + "/" + backend.backend_id, variant, availability, reserved: backend.reserved, dimmed }),
              )
            : h(C.Text, { fontSize: "xs", color: "fg.muted" }, "reports no device capacity")
          : h(C.Text, { fontSize: "xs", color: "fg.muted" }, "capacity not reported: matched on shape alone"),
      ),
      backend.held_for
        ? h(
            C.Badge,
            { colorPalette: "purple", variant: "subtle", mt: 1, whiteSpace: "normal", "data-testid": "backend-hold" },
            backend.held_for.text,
          )
        : null,
    );
  }

  function PeerCard({ peer }) {
    const health = peer.reachable ? "reachable" : peer.stale ? "stale" : peer.lost ? "lost" : "unreachable";
    const palette = peer.reachable ? "success" : peer.stale ? "warning" : "failed";
    return h(
      C.Card.Root,
      { size: "sm", variant: "outline", opacity: peer.reachable ? 1 : 0.6, "data-testid": "peer-" + peer.peer_id },
      h(
        C.Card.Header,
        null,
        h(
          C.Flex,
          { justify: "space-between", align: "center", gap: 2 },
          h(C.Heading, { size: "sm" }, peer.peer_id),
          h(C.Badge, { colorPalette: palette, variant: "solid" }, health),
        ),
        h(
          C.Text,
          { fontSize: "xs", color: "fg.muted" },
          (peer.kind || "peer") +
            (peer.controller_address ? " · " + peer.controller_address : "") +
            " · heartbeat " +
            (peer.heartbeat_age_ms === null ? "never" : duration(peer.heartbeat_age_ms) + " ago") +
            " · " +
            peer.active_federated_jobs +
            " active job(s)",
        ),
        peer.last_error ? h(C.Text, { fontSize: "xs", color: "fg.error" }, peer.last_error) : null,
        peer.lost
          ? h(
              C.Text,
              { fontSize: "xs", color: "fg.error", "data-testid": "peer-lost-" + peer.peer_id },
              "lost: unreachable for " + duration(peer.unreachable_for_ms) + "; its jobs were settled without it",
            )
          : null,
        peer.superseded_incarnations
          ? h(
              C.Text,
              { fontSize: "xs", color: "fg.muted", "data-testid": "peer-superseded-" + peer.peer_id },
              peer.superseded_incarnations + " superseded incarnation(s) to terminate there once it answers",
            )
          : null,
      ),
      h(
        C.Card.Body,
        { pt: 0 },
        peer.backends.length
          ? peer.backends.map((backend) => h(BackendBlock, { key: backend.backend_id, owner: peer.peer_id, backend, dimmed: !peer.reachable }))
          : h(C.Text, { fontSize: "sm", color: "fg.muted" }, "no backends reported yet"),
      ),
    );
  }

  function LocalCard({ cluster, backends }) {
    return h(
      C.Card.Root,
      { size: "sm", variant: "outline", "data-testid": "local-backends" },
      h(
        C.Card.Header,
        null,
        h(
          C.Flex,
          { justify: "space-between", align: "center" },
          h(C.Heading, { size: "sm" }, cluster + " (this cluster)"),
          h(C.Badge, { colorPalette: "brand", variant: "subtle" }, "local"),
        ),
      ),
      h(
        C.Card.Body,
        { pt: 0 },
        backends.length
          ? backends.map((backend) => h(BackendBlock, { key: backend.backend_id, owner: cluster, backend }))
          : h(C.Text, { fontSize: "sm", color: "fg.muted" }, "no local backends"),
      ),
    );
  }

  function FleetStrip({ fleet }) {
    if (!fleet.length) return null;
    return h(
      C.Flex,
      { wrap: "wrap", gap: 3, mb: 4, "data-testid": "fleet" },
      fleet.map((entry) =>
        h(
          C.Box,
          {
            key: entry.variant,
            borderWidth: "1px",
            borderColor: "border",
            borderRadius: "md",
            px: 3,
            py: 2,
            minW: "150px",
            bg: "bg.subtle",
            title: entry.targets
              .map((t) => t.target + ": " + t.free + " / " + t.total + " free" + (t.reserved ? ", " + t.reserved + " reserved" : ""))
              .join("\n"),
          },
          h(C.Text, { fontSize: "xs", color: "fg.muted", textTransform: "uppercase" }, entry.variant),
          h(C.Text, { fontSize: "lg", fontWeight: "semibold" }, entry.free + " / " + entry.total + " free"),
          entry.reserved
            ? h(C.Text, { fontSize: "xs", color: "fg.muted" }, entry.reserved + " reserved for jobs handed off and not yet running there")
            : null,
          h(C.Progress.Root, { value: entry.total ? (100 * entry.free) / entry.total : 0, size: "xs", colorPalette: "success", mt: 1 },
            h(C.Progress.Track, null, h(C.Progress.Range))),
        ),
      ),
    );
  }

  function CapacitySection() {
    const { data, error } = usePolled(() => api("peers"), []);
    if (!data) return error ? h(ErrorNote, { error }) : h(C.Spinner, { size: "sm" });
    return h(
      C.Box,
      { as: "section", mb: 6 },
      h(ErrorNote, { error }),
      h(C.Heading, { size: "md", mb: 2 }, "Capacity"),
      h(C.Text, { fontSize: "sm", color: "fg.muted", mb: 3 }, "Across local backends and reachable peers; unreachable or stale peers are dimmed and not counted."),
      h(FleetStrip, { fleet: data.fleet }),
      h(
        C.SimpleGrid,
        { columns: { base: 1, md: 2, xl: 3 }, gap: 3 },
        h(LocalCard, { cluster: data.cluster, backends: data.local_backends }),
        data.peers.map((peer) => h(PeerCard, { key: peer.peer_id, peer })),
      ),
    );
  }

  // Jobs -----------------------------------------------------------------------------------------

  function Select({ label, value, onChange, options }) {
    return h(
      C.Box,
      { minW: "160px" },
      h(C.Text, { fontSize: "xs", color: "fg.muted", mb: 1 }, label),
      h(
        C.NativeSelect.Root,
        { size: "sm" },
        h(
          C.NativeSelect.Field,
          { value, onChange: (event) => onChange(event.target.value), "aria-label": label },
          options.map(([optionValue, text]) => h("option", { key: optionValue, value: optionValue }, text)),
        ),
        h(C.NativeSelect.Indicator),
      ),
    );
  }

  function jobSearch(params, jobId) {
    const next = new URLSearchParams(params);
    next.set("job", jobId);
    return "?" + next.toString();
  }

  function JobsSection({ params, setParam }) {
    const state = params.get("state") || "";
    const peer = params.get("peer") || "";
    const submitter = params.get("submitter") || "";
    const search = params.get("q") || "";
    const page = Math.max(0, Number(params.get("page") || 0) || 0);
    const [typed, setTyped] = useState(search);
    useEffect(() => setTyped(search), [search]);
    useEffect(() => {
      const timer = setTimeout(() => typed !== search && setParam({ q: typed, page: "" }), 400);
      return () => clearTimeout(timer);
    }, [typed, search, setParam]);

    const { data, error, loading } = usePolled(
      () => api("jobs", { state, peer, submitter, q: search, limit: PAGE_SIZE, offset: page * PAGE_SIZE }),
      [state, peer, submitter, search, page],
    );
    const facets = (data && data.facets) || { states: {}, peers: [], submitters: [] };
    const total = data ? data.total : 0;
    const first = total ? page * PAGE_SIZE + 1 : 0;
    const last = Math.min(total, (page + 1) * PAGE_SIZE);

    return h(
      C.Box,
      { as: "section" },
      h(
        C.Flex,
        { align: "center", justify: "space-between", mb: 2 },
        h(C.Heading, { size: "md" }, "Jobs"),
        loading ? h(C.Spinner, { size: "xs", color: "fg.muted" }) : null,
      ),
      h(
        C.Flex,
        { wrap: "wrap", gap: 3, mb: 3, align: "end" },
        h(Select, {
          label: "State",
          value: state,
          onChange: (value) => setParam({ state: value, page: "" }),
          options: [["", "all states"], ...STATES.map((s) => [s, s + " (" + (facets.states[s] || 0) + ")"])],
        }),
        h(Select, {
          label: "Peer",
          value: peer,
          onChange: (value) => setParam({ peer: value, page: "" }),
          options: [["", "all peers"], ...facets.peers.map((p) => [p, p])],
        }),
        h(Select, {
          label: "Submitter",
          value: submitter,
          onChange: (value) => setParam({ submitter: value, page: "" }),
          options: [["", "everyone"], ...facets.submitters.map((s) => [s, s])],
        }),
        h(
          C.Box,
          { minW: "240px" },
          h(C.Text, { fontSize: "xs", color: "fg.muted", mb: 1 }, "Job id contains"),
          h(C.Input, { size: "sm", value: typed, placeholder: "e.g. train", "aria-label": "Job id contains", onChange: (event) => setTyped(event.target.value) }),
        ),
      ),
      h(ErrorNote, { error }),
      h(
        C.Table.ScrollArea,
        { borderWidth: "1px", borderColor: "border", borderRadius: "md" },
        h(
          C.Table.Root,
          { size: "sm", striped: true, "data-testid": "jobs-table" },
          h(
            C.Table.Header,
            null,
            h(
              C.Table.Row,
              null,
              ["Job", "State", "Handoff", "Peer", "Backend", "Band", "Request", "Submitter", "Age", "Pending reason / error", "Task"].map((title) =>
                h(C.Table.ColumnHeader, { key: title, whiteSpace: "nowrap" }, title),
              ),
            ),
          ),
          h(
            C.Table.Body,
            null,
            data && data.jobs.length
              ? data.jobs.map((job) =>
                  h(
                    C.Table.Row,
                    { key: job.job_id, "data-job-id": job.job_id },
                    h(
                      C.Table.Cell,
                      { minW: "220px", maxW: "340px", whiteSpace: "normal", wordBreak: "break-all" },
                      h(
                        C.Link,
                        { asChild: true, colorPalette: "blue", wordBreak: "break-all", fontFamily: "mono", fontSize: "xs" },
                        h(Router.Link, { to: { search: jobSearch(params, job.job_id) }, title: "Details, explanation and history" }, job.job_id),
                      ),
                    ),
                    h(C.Table.Cell, null, h(StateBadge, { state: job.state })),
                    h(C.Table.Cell, null, h(HandoffBadge, { handoff: job.handoff_state })),
                    h(C.Table.Cell, null, job.peer_id || (job.direction === "local" ? "(local)" : "–")),
                    h(C.Table.Cell, null, job.backend_id || "–"),
                    h(C.Table.Cell, null, bandName(job.priority_band)),
                    h(C.Table.Cell, { whiteSpace: "nowrap" }, job.resources),
                    h(C.Table.Cell, null, job.submitter || "–"),
                    h(C.Table.Cell, { whiteSpace: "nowrap", title: when(job.submitted_at_ms) }, duration(job.age_ms)),
                    h(
                      C.Table.Cell,
                      { maxW: "360px", "data-testid": "pending-reason" },
                      job.pending_reason
                        ? h(
                            C.Box,
                            null,
                            h(C.Text, { fontSize: "sm" }, job.pending_reason),
                            job.never_fits
                              ? h(
                                  C.Badge,
                                  { colorPalette: "red", variant: "subtle", title: "No reachable backend is large enough: open it for why", "data-testid": "never-fits" },
                                  "can never fit",
                                )
                              : null,
                          )
                        : job.error
                          ? h(C.Text, { fontSize: "sm", color: "fg.error" }, job.error)
                          : h(C.Text, { color: "fg.muted" }, "–"),
                    ),
                    h(C.Table.Cell, { whiteSpace: "nowrap" }, h(TaskLink, { job })),
                  ),
                )
              : h(
                  C.Table.Row,
                  null,
                  h(C.Table.Cell, { colSpan: 11, color: "fg.muted", textAlign: "center", py: 6 }, data ? "No jobs match." : "Loading…"),
                ),
          ),
        ),
      ),
      h(
        C.Flex,
        { justify: "space-between", align: "center", mt: 2 },
        h(C.Text, { fontSize: "sm", color: "fg.muted", "data-testid": "jobs-count" }, first + "–" + last + " of " + total.toLocaleString()),
        h(
          C.HStack,
          null,
          h(C.Button, { size: "xs", variant: "outline", disabled: page === 0, onClick: () => setParam({ page: page - 1 || "" }) }, "Previous"),
          h(C.Button, { size: "xs", variant: "outline", disabled: last >= total, onClick: () => setParam({ page: page + 1 }) }, "Next"),
        ),
      ),
    );
  }

  // Job detail -----------------------------------------------------------------------------------

  // A titled block of the job drawer.
  function Section({ title, children }) {
    return h(C.Box, null, h(C.Heading, { size: "sm", mb: 2 }, title), children);
  }

  // A small table with a row per item; each row's cells come from cells(item).
  function ItemTable({ testid, items, rowKey, cells }) {
    return h(
      C.Table.Root,
      { size: "sm", "data-testid": testid },
      h(C.Table.Body, null, items.map((item) => h(C.Table.Row, { key: rowKey(item) }, ...cells(item)))),
    );
  }

  function Field({ label, children }) {
    return h(
      C.DataList.Item,
      null,
      h(C.DataList.ItemLabel, { minW: "130px" }, label),
      h(C.DataList.ItemValue, { wordBreak: "break-word" }, children),
    );
  }

  function amountText(amounts) {
    const entries = Object.entries(amounts || {});
    return entries.length ? entries.map(([token, n]) => n + " " + token).join(", ") : "–";
  }

  // What else keeps capacity on a backend from this job: reservations and a starving job's hold.
  function backendNote(backend) {
    const notes = [];
    if (backend.reserved) notes.push(amountText(backend.reserved) + " " + backend.reserved_note);
    if (backend.hold) notes.push(backend.hold);
    return notes.join("; ");
  }

  function Explanation({ explained }) {
    if (!explained) return h(C.Spinner, { size: "sm" });
    const detail = explained.explanation;
    return h(
      C.Box,
      { "data-testid": "explanation" },
      h(C.Text, { fontWeight: "semibold", mb: 2 }, explained.summary),
      detail
        ? h(
            C.Box,
            null,
            h(
              C.Text,
              { fontSize: "sm", color: "fg.muted", mb: 2 },
              "Needs " +
                (Object.keys(detail.gate).length ? amountText(detail.gate) + " on one backend" : "no gated capacity") +
                (detail.constraints.length ? "; routing: " + detail.constraints.join(", ") : "") +
                "; band " +
                bandName(detail.band) +
                "; " +
                (detail.jobs_ahead ? detail.jobs_ahead + " queued job(s) ahead of it." : "first in the queue."),
            ),
            h(
              C.Table.Root,
              { size: "sm", variant: "outline" },
              h(
                C.Table.Header,
                null,
                h(
                  C.Table.Row,
                  null,
                  ["Peer", "Backend", "Shape", "Free", "Reclaimable", "Fits", "Note"].map((title) => h(C.Table.ColumnHeader, { key: title }, title)),
                ),
              ),
              h(
                C.Table.Body,
                null,
                detail.peers.flatMap((peer) =>
                  (peer.backends.length ? peer.backends : [null]).map((backend, index) =>
                    h(
                      C.Table.Row,
                      { key: peer.peer_id + "/" + (backend ? backend.backend_id : index) },
                      h(C.Table.Cell, null, index === 0 ? h(C.Box, null, peer.peer_id, peer.status !== "ok" ? h(C.Text, { fontSize: "xs", color: "fg.warning" }, peer.status) : null) : ""),
                      h(C.Table.Cell, null, backend ? backend.backend_id : "no backends"),
                      h(
                        C.Table.Cell,
                        null,
                        backend ? (backend.shape_matches ? "matches" : h(C.Text, { color: "fg.error", fontSize: "sm" }, "needs " + backend.unmet.join(", "))) : "–",
                        backend && backend.unreadable_paths
                          ? h(C.Text, { color: "fg.warning", fontSize: "xs" }, "cannot read " + backend.unreadable_paths.join(", "))
                          : null,
                      ),
                      h(C.Table.Cell, null, backend ? (backend.capacity ? backend.capacity : amountText(backend.free)) : "–"),
                      h(C.Table.Cell, null, backend && backend.reclaimable ? amountText(backend.reclaimable) : "–"),
                      h(C.Table.Cell, null, backend && backend.fits !== undefined ? (backend.fits ? "yes" : "no") : "–"),
                      h(C.Table.Cell, { fontSize: "xs", "data-testid": "backend-note" }, backend ? backendNote(backend) : ""),
                    ),
                  ),
                ),
              ),
            ),
          )
        : null,
    );
  }

  function CancelControl({ job, onDone }) {
    const [confirming, setConfirming] = useState(false);
    const [busy, setBusy] = useState(false);
    const [result, setResult] = useState(null);
    // The outcome stays in view after the job (now finished) can no longer be cancelled.
    if (!job.can_cancel && !result) return null;
    const cancel = () => {
      setBusy(true);
      api("jobs/cancel", { job_id: job.job_id }, "POST").then(
        (answer) => {
          setResult({ ok: true, message: answer.message });
          setBusy(false);
          setConfirming(false);
          onDone();
        },
        (error) => {
          setResult({ ok: false, message: error.message });
          setBusy(false);
        },
      );
    };
    return h(
      C.Box,
      null,
      !job.can_cancel
        ? null
        : confirming
        ? h(
            C.HStack,
            null,
            h(C.Text, { fontSize: "sm" }, "Cancel this job?"),
            h(C.Button, { size: "sm", colorPalette: "red", loading: busy, onClick: cancel }, "Yes, cancel it"),
            h(C.Button, { size: "sm", variant: "ghost", onClick: () => setConfirming(false) }, "Keep it"),
          )
        : h(C.Button, { size: "sm", colorPalette: "red", variant: "outline", onClick: () => setConfirming(true) }, "Cancel job"),
      result ? h(C.Text, { fontSize: "sm", mt: 1, color: result.ok ? "fg.success" : "fg.error", "data-testid": "cancel-result" }, result.message) : null,
    );
  }

  function JobDetail({ jobId, onClose }) {
    const described = usePolled(() => api("jobs/describe", { job_id: jobId }), [jobId]);
    const explained = usePolled(() => api("jobs/explain", { job_id: jobId }), [jobId]);
    const job = described.data;
    const reload = () => {
      described.reload();
      explained.reload();
    };
    return h(
      C.Drawer.Root,
      { open: true, size: "xl", placement: "end", onOpenChange: (event) => !event.open && onClose() },
      h(
        C.Portal,
        null,
        h(C.Drawer.Backdrop),
        h(
          C.Drawer.Positioner,
          null,
          h(
            C.Drawer.Content,
            { "data-testid": "job-detail" },
            h(
              C.Drawer.Header,
              null,
              h(
                C.Box,
                null,
                h(C.Drawer.Title, { fontFamily: "mono", fontSize: "sm", wordBreak: "break-all" }, jobId),
                job ? h(C.HStack, { mt: 2 }, h(StateBadge, { state: job.state }), h(HandoffBadge, { handoff: job.handoff_state })) : null,
              ),
            ),
            h(
              C.Drawer.Body,
              null,
              h(ErrorNote, { error: described.error }),
              job
                ? h(
                    C.Stack,
                    { gap: 6 },
                    h(CancelControl, { job, onDone: reload }),
                    job.pending_reason
                      ? h(C.Alert.Root, { status: "info" }, h(C.Alert.Indicator), h(C.Alert.Title, { "data-testid": "detail-pending-reason" }, job.pending_reason))
                      : job.error
                        ? h(C.Alert.Root, { status: "error" }, h(C.Alert.Indicator), h(C.Alert.Title, null, job.error))
                        : null,
                    h(
                      C.DataList.Root,
                      { orientation: "horizontal", size: "sm" },
                      h(Field, { label: "Direction" }, job.direction),
                      h(Field, { label: "Peer / backend" }, (job.peer_id || "–") + " / " + (job.backend_id || "–")),
                      h(Field, { label: "Band" }, bandName(job.priority_band)),
                      h(Field, { label: "Request" }, job.resources),
                      h(Field, { label: "Submitter" }, job.submitter || "–"),
                      h(Field, { label: "Submitted" }, when(job.submitted_at_ms) + " (" + duration(job.age_ms) + " ago)"),
                      h(Field, { label: "Started / finished" }, when(job.started_at_ms) + " / " + when(job.finished_at_ms)),
                      h(Field, { label: "Deadline" }, when(job.scheduling_deadline_ms)),
                      job.exit_code !== null ? h(Field, { label: "Exit code" }, String(job.exit_code)) : null,
                      Object.keys(job.serving_urls || {}).length
                        ? h(
                            Field,
                            { label: "Serving" },
                            h(
                              C.Stack,
                              { gap: 0 },
                              ...Object.entries(job.serving_urls).map(([name, url]) =>
                                h(C.Link, { key: name, href: url, target: "_blank", rel: "noreferrer", "data-testid": "serving-url" }, name + ": " + url),
                              ),
                            ),
                          )
                        : null,
                      job.delivery_attempts ? h(Field, { label: "Delivery" }, job.delivery_attempts + " failed attempt(s): " + job.last_delivery_error) : null,
                      job.requeue_count
                        ? h(Field, { label: "Requeued" }, job.requeue_count + " time(s)" + (job.avoided_peers.length ? "; avoiding " + job.avoided_peers.join(", ") + " for now" : ""))
                        : null,
                      h(Field, { label: "Task instance" }, h(TaskLink, { job })),
                    ),
                    h(
                      Section,
                      { title: job.pending_reason ? "Why it waits" : "Where it stands" },
                      h(ErrorNote, { error: explained.error }),
                      h(Explanation, { explained: explained.data }),
                    ),
                    h(
                      Section,
                      { title: "History" },
                      h(ItemTable, {
                        testid: "history",
                        items: job.events,
                        rowKey: (event) => event.seq,
                        cells: (event) => [
                          h(C.Table.Cell, { whiteSpace: "nowrap", color: "fg.muted" }, when(event.at_ms)),
                          h(C.Table.Cell, { fontWeight: "semibold" }, event.kind.replace(/_/g, " ")),
                          h(C.Table.Cell, null, [event.state, event.handoff_state && "handoff " + event.handoff_state, event.peer_id && "peer " + event.peer_id].filter(Boolean).join(" · ")),
                          h(C.Table.Cell, { wordBreak: "break-word" }, event.detail),
                        ],
                      }),
                      job.pending_reasons.length
                        ? h(C.Text, { fontSize: "sm", color: "fg.muted", mt: 2 }, "Pending reasons so far: " + job.pending_reasons.join(" → "))
                        : null,
                    ),
                    job.replicas && job.replicas.length
                      ? h(
                          Section,
                          { title: "Replicas" },
                          h(ItemTable, {
                            testid: "replicas",
                            items: job.replicas,
                            rowKey: (replica) => replica.index,
                            cells: (replica) => [
                              h(C.Table.Cell, { fontWeight: "semibold" }, "replica " + replica.index),
                              h(C.Table.Cell, null, replica.state),
                              h(C.Table.Cell, null, replica.exit_code === null ? "" : "exit code " + replica.exit_code),
                            ],
                          }),
                        )
                      : null,
                    job.children && job.children.length
                      ? h(
                          Section,
                          { title: "Children" },
                          // Its tree, which runs on one cluster (mirrored from the peer for a handed-off root).
                          h(ItemTable, {
                            testid: "children",
                            items: job.children,
                            rowKey: (child) => child.job_id,
                            cells: (child) => [
                              h(
                                C.Table.Cell,
                                { fontWeight: "semibold", wordBreak: "break-all", pl: 2 + 3 * (child.job_id.split("/").length - job.job_id.replace(/^[^/]*:/, "").split("/").length - 1) },
                                child.job_id.slice(child.job_id.lastIndexOf("/") + 1),
                              ),
                              h(C.Table.Cell, null, child.state),
                              h(C.Table.Cell, null, child.exit_code === null ? "" : "exit code " + child.exit_code),
                              h(C.Table.Cell, { wordBreak: "break-word" }, child.error),
                            ],
                          }),
                        )
                      : null,
                    job.output_tail.length
                      ? h(
                          Section,
                          { title: "Latest output" },
                          h(C.Box, { as: "pre", fontSize: "xs", bg: "bg.muted", p: 2, borderRadius: "md", overflowX: "auto", maxH: "240px" }, job.output_tail.join("\n")),
                        )
                      : null,
                    h(
                      Section,
                      { title: "Spec" },
                      h(C.Box, { as: "pre", fontSize: "xs", bg: "bg.muted", p: 2, borderRadius: "md", overflowX: "auto" }, JSON.stringify(job.spec, null, 2)),
                    ),
                  )
                : described.error
                  ? null
                  : h(C.Spinner),
            ),
            h(C.Drawer.CloseTrigger, { asChild: true }, h(C.CloseButton, { size: "sm", "aria-label": "Close" })),
          ),
        ),
      ),
    );
  }

  // The page -------------------------------------------------------------------------------------

  function FederationPage() {
    const [params, setParams] = Router.useSearchParams();
    const setParam = useCallback(
      (changes) =>
        setParams((current) => {
          const next = new URLSearchParams(current);
          Object.entries(changes).forEach(([key, value]) => {
            if (value === "" || value === null || value === undefined || value === 0) next.delete(key);
            else next.set(key, String(value));
          });
          return next;
        }),
      [setParams],
    );
    const jobId = params.get("job");
    return h(
      C.Box,
      { p: 2, "data-testid": "federation-page" },
      h(C.Heading, { size: "lg", mb: 4 }, "Federation"),
      h(CapacitySection),
      h(JobsSection, { params, setParam }),
      jobId ? h(JobDetail, { key: jobId, jobId, onClose: () => setParam({ job: "" }) }) : null,
    );
  }

  globalThis.AirflowPlugin = FederationPage;
})();
