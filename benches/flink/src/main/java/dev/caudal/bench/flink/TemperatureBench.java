package dev.caudal.bench.flink;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Stream;
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

/**
 * Runs one pipeline once in a local MiniCluster (this JVM) and prints one row in the format
 * of Caudal's throughput runner: records/s, records/s per CPU-core-second, CPU-seconds per
 * million records and peak RSS, measured the same way (wall clock and /proc/self CPU ticks
 * around the job's execute(), VmHWM at the end). The pipelines are the runner's of the same
 * names: {@code temperature} ({@link TemperaturePipeline}, the default), {@code count}
 * ({@link CountPipeline}), {@code timers} ({@link TimersPipeline}) and {@code alerts}
 * ({@link AlertsPipeline}); the warm-up job runs the same pipeline.
 *
 * <pre>
 * java -cp 'flink-temperature-bench-1.jar:libs/*' dev.caudal.bench.flink.TemperatureBench \
 *     --records 20000000 --sensors 10000 --parallelism 1 --state heap [--warmup-records N]
 *     [--pipeline temperature|count|timers|alerts] [--checkpoint-interval SECS]
 *     [--conf flink.option=value ...] [--no-header]
 * </pre>
 */
public final class TemperatureBench {
    /** Highest checkpoint id a source reader saw completed. */
    static final AtomicLong CHECKPOINTS = new AtomicLong();

    /** The --pipeline values. */
    static final List<String> PIPELINES = List.of("temperature", "count", "timers", "alerts");

    private TemperatureBench() {}

    public static void main(String[] argv) throws Exception {
        long records = 20_000_000;
        long sensors = 10_000;
        int parallelism = 1;
        String state = "heap";
        String pipeline = "temperature";
        double checkpointInterval = 0;
        long warmupRecords = 0;
        boolean header = true;
        Map<String, String> extra = new LinkedHashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String flag = argv[i];
            if (flag.equals("--no-header")) {
                header = false;
                continue;
            }
            if (i + 1 >= argv.length) {
                throw new IllegalArgumentException(flag + " needs a value");
            }
            String v = argv[++i];
            switch (flag) {
                case "--records" -> records = Long.parseLong(v);
                case "--sensors" -> sensors = Long.parseLong(v);
                case "--parallelism" -> parallelism = Integer.parseInt(v);
                case "--state" -> state = v;
                case "--pipeline" -> pipeline = v;
                case "--checkpoint-interval" -> checkpointInterval = Double.parseDouble(v);
                case "--warmup-records" -> warmupRecords = Long.parseLong(v);
                case "--conf" -> {
                    int eq = v.indexOf('=');
                    if (eq < 1) {
                        throw new IllegalArgumentException("--conf needs key=value, got " + v);
                    }
                    extra.put(v.substring(0, eq), v.substring(eq + 1));
                }
                default -> throw new IllegalArgumentException("unknown flag " + flag);
            }
        }
        if (!state.equals("heap") && !state.equals("rocksdb")) {
            throw new IllegalArgumentException("--state must be heap or rocksdb, got " + state);
        }
        if (!PIPELINES.contains(pipeline)) {
            throw new IllegalArgumentException("--pipeline must be one of " + PIPELINES + ", got " + pipeline);
        }
        if (sensors < 1 || records < 1 || parallelism < 1) {
            throw new IllegalArgumentException("--records, --sensors and --parallelism must be at least 1");
        }
        if (warmupRecords > 0) {
            // A first job in the same JVM, so the measured one runs JIT-compiled code.
            run(pipeline, warmupRecords, sensors, parallelism, state, 0, extra);
        }
        long[] before = new long[CountingSink.COUNTS.length()];
        for (int c = 0; c < before.length; c++) {
            before[c] = CountingSink.COUNTS.get(c);
        }
        double cpu0 = ProcFs.cpuSeconds();
        long t0 = System.nanoTime();
        JobExecutionResult result = run(pipeline, records, sensors, parallelism, state, checkpointInterval, extra);
        double secs = (System.nanoTime() - t0) / 1e9;
        double cpu = ProcFs.cpuSeconds() - cpu0;
        long read = CountingSink.COUNTS.get(CountingSink.SOURCE) - before[CountingSink.SOURCE];
        long readingsOut = CountingSink.COUNTS.get(CountingSink.READINGS) - before[CountingSink.READINGS];
        long windowsOut = CountingSink.COUNTS.get(CountingSink.WINDOWS) - before[CountingSink.WINDOWS];
        long outputs = CountingSink.COUNTS.get(CountingSink.OUTPUTS) - before[CountingSink.OUTPUTS];
        if (header) {
            System.out.printf("%-12s %7s %3s %12s %8s %14s %16s %14s %10s %6s%n", "pipeline", "state", "p",
                    "records", "secs", "records/s", "rec/s per core", "CPU-s per 1M", "peak RSS", "chkpts");
        }
        double coresUsed = Math.max(cpu / secs, 0.01);
        System.out.printf("%-12s %7s %3d %12d %8.2f %14.0f %16.0f %14.3f %7d MB %6d%n", pipeline, state,
                parallelism, read, secs, read / secs, read / secs / coresUsed, cpu / (read / 1e6),
                ProcFs.statusKb("VmHWM:") / 1024, CHECKPOINTS.get());
        double net = result.getNetRuntime() / 1000.0;
        String outs = switch (pipeline) {
            case "count" -> String.format("outputs %d (the count emits nothing)", outputs);
            case "timers" -> String.format("timers fired %d (of %d records: all fire)", outputs, read);
            case "alerts" -> String.format("readings out %d, windows out %d, alerts out %d", readingsOut, windowsOut,
                    outputs);
            default -> String.format("readings out %d, windows out %d", readingsOut, windowsOut);
        };
        System.out.printf("#   flink job net runtime %.2f s (%.0f records/s without MiniCluster start/stop); %s%n",
                net, read / net, outs);
    }

    private static JobExecutionResult run(String pipeline, long records, long sensors, int parallelism, String state,
            double checkpointInterval, Map<String, String> extra) throws Exception {
        Configuration conf = new Configuration();
        conf.set(StateBackendOptions.STATE_BACKEND, state.equals("heap") ? "hashmap" : "rocksdb");
        conf.set(PipelineOptions.OBJECT_REUSE, true);
        // Any Flink option, e.g. state.backend.rocksdb.timer-service.factory=HEAP.
        conf.addAll(Configuration.fromMap(extra));
        Path checkpoints = null;
        if (checkpointInterval > 0) {
            checkpoints = Files.createTempDirectory("flink-throughput-");
            conf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, checkpoints.toUri().toString());
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(parallelism, conf);
        if (checkpointInterval > 0) {
            env.enableCheckpointing((long) (checkpointInterval * 1000));
        }
        SensorModel model = new SensorModel(1, sensors, records, 0.01, 8);
        switch (pipeline) {
            case "count" -> CountPipeline.build(env, model);
            case "timers" -> TimersPipeline.build(env, model);
            case "alerts" -> AlertsPipeline.build(env, model);
            default -> TemperaturePipeline.build(env, model);
        }
        try {
            return env.execute(pipeline);
        } finally {
            if (checkpoints != null) {
                deleteTree(checkpoints);
            }
        }
    }

    private static void deleteTree(Path dir) throws IOException {
        try (Stream<Path> paths = Files.walk(dir)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
    }
}
