-- A sandbox's start in microseconds, no longer whole seconds: E2B reports `startedAt` with
-- fractions of a second and lists newest first by it, so two sandboxes made in the same second
-- must not tie. The unit is in the name, so no reader takes the new numbers for seconds.
ALTER TABLE sandboxes RENAME COLUMN started_at TO started_at_us;
UPDATE sandboxes SET started_at_us = started_at_us * 1000000;
