-- Achieved model TFLOP/s of the rank's GPU and its model FLOPs utilisation
-- (a fraction of the GPU's dense peak at the run's precision), as the hook
-- computes them per step. Nullable without a default: adding them touches
-- no existing row, compressed chunks included.
ALTER TABLE steps ADD COLUMN tflops double precision;
ALTER TABLE steps ADD COLUMN mfu double precision;
