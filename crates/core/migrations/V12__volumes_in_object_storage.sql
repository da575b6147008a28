-- A volume moved off a drained node waits in object storage until a node needs it: `stored`
-- names its image there, and `node` is '' meanwhile (a node taking it in names itself first,
-- and clears `stored` once its files are here).
ALTER TABLE volumes ADD COLUMN stored TEXT;
