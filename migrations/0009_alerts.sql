-- Alerts opened by the server's detectors (package alerts). One row per
-- firing: it stays open (resolved_at NULL) while its condition holds and
-- is resolved when it clears. The partial unique index makes an alert
-- single while active: a detector that fires again on the next pass
-- updates the open row instead of adding one. subject says what the alert
-- is about inside the run: '' for the run as a whole, 'rank 2', or
-- 'host/gpu 3'.
CREATE TABLE alerts (
    id          bigserial PRIMARY KEY,
    run_id      text NOT NULL,
    kind        text NOT NULL,
    subject     text NOT NULL DEFAULT '',
    rank        integer,
    step        bigint,
    value       double precision,
    threshold   double precision,
    text        text NOT NULL DEFAULT '',
    -- at is the time of the data that fired (a step's or sample's time),
    -- opened_at and resolved_at the server's clock.
    at          timestamptz NOT NULL,
    opened_at   timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz
);
CREATE UNIQUE INDEX alerts_active ON alerts (run_id, kind, subject) WHERE resolved_at IS NULL;
CREATE INDEX alerts_run_opened ON alerts (run_id, opened_at);
CREATE INDEX alerts_opened ON alerts (opened_at DESC, id DESC);
