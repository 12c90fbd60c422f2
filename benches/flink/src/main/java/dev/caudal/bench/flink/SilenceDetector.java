package dev.caudal.bench.flink;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

/**
 * Caudal's silent-sensor detector (jobs/src/alerts.rs), statement for statement: a sensor
 * with no reading for {@code silence} of event time raises one SILENT alert (at its last
 * reading + silence), and one RECOVERED at its first reading after that. Per sensor it keeps
 * the time of its latest reading ("last-seen") and whether it is silent ("silent"), and one
 * event-time timer at latest + silence, moved on each reading (delete, register). The end of
 * a bounded input is not an outage: the timers the final watermark fires raise nothing.
 *
 * <p>One difference that changes no count: Caudal stamps a SILENT raised on a reading with
 * its own time (last + silence); Flink's Collector gives it the reading's timestamp.
 */
final class SilenceDetector extends KeyedProcessFunction<Long, ProcessedReading, SensorAlert> {
    private final long silenceMs;
    private transient ValueState<Long> lastSeen;
    private transient ValueState<Boolean> silent;

    SilenceDetector(long silenceMs) {
        this.silenceMs = Math.max(silenceMs, 1);
    }

    @Override
    public void open(OpenContext ctx) {
        lastSeen = getRuntimeContext().getState(new ValueStateDescriptor<>("last-seen", Types.LONG));
        silent = getRuntimeContext().getState(new ValueStateDescriptor<>("silent", Types.BOOLEAN));
    }

    @Override
    public void processElement(ProcessedReading r, Context ctx, Collector<SensorAlert> out) throws Exception {
        long ts = r.ts;
        Long last = lastSeen.value();
        if (last != null) {
            if (ts <= last) {
                return; // older than what the sensor already reported: no news
            }
            ctx.timerService().deleteEventTimeTimer(last + silenceMs);
            boolean isSilent = Boolean.TRUE.equals(silent.value());
            if (!isSilent && ts - last > silenceMs) {
                out.collect(new SensorAlert(r.sensorId, SensorAlert.Kind.SILENT, last + silenceMs, last));
                isSilent = true;
            }
            if (isSilent) {
                out.collect(new SensorAlert(r.sensorId, SensorAlert.Kind.RECOVERED, ts, last));
                silent.clear();
            }
        }
        lastSeen.update(ts);
        ctx.timerService().registerEventTimeTimer(ts + silenceMs);
    }

    @Override
    public void onTimer(long ts, OnTimerContext ctx, Collector<SensorAlert> out) throws Exception {
        if (ctx.timerService().currentWatermark() == Long.MAX_VALUE) {
            return; // the input ended: not an outage
        }
        Long last = lastSeen.value();
        silent.update(true);
        out.collect(new SensorAlert(ctx.getCurrentKey(), SensorAlert.Kind.SILENT, ts,
                last != null ? last : ts - silenceMs));
    }
}
