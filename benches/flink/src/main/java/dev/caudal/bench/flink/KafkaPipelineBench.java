package dev.caudal.bench.flink;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.kafka.clients.admin.Admin;

/**
 * Kafka → Avro decode → °F→°C → anomaly filter → Kafka in a local MiniCluster (this JVM),
 * beside Caudal's benches/src/bin/kafka_pipeline.rs: reads the whole input topic (bounded),
 * writes into a new output topic per run (2 partitions, like Caudal's), checkpoints every
 * --checkpoint-interval seconds (exactly-once commits at each), and prints one row per run:
 * mode, parallelism, input records, seconds, records/s (input records / wall seconds) and
 * records per CPU-second (/proc/self CPU of this JVM, all threads), measured around the
 * job's execute() like Caudal's runner. The broker's CPU is not counted. Before the
 * measured runs the same JVM runs --warmup-runs jobs over the same topic (not printed as
 * rows), so the measured ones run JIT-compiled code.
 *
 * <pre>
 * java -cp 'flink-temperature-bench-1.jar:libs/*' dev.caudal.bench.flink.KafkaPipelineBench \
 *     --input-topic T --parallelism 1 [--delivery exactly-once,at-least-once] [--runs 1]
 *     [--checkpoint-interval 1] [--warmup-runs 1] [--avro specific|generic] [--records N]
 *     [--brokers B] [--schema-registry URL] [--conf flink.option=value ...] [--no-header]
 *     [--produce N [--sensors 1000]] [--delete-topics]
 * </pre>
 *
 * --brokers and --schema-registry default to $CAUDAL_KAFKA_BROKERS and
 * $CAUDAL_SCHEMA_REGISTRY (scripts/services.sh env). --records N only checks that the job
 * read N records. Test mode: --produce N first creates the input topic (4 partitions; named
 * by --input-topic or made up) and writes N readings into it ({@link ReadingsProducer});
 * --delete-topics deletes the topics this run created when it is done.
 */
public final class KafkaPipelineBench {
    private KafkaPipelineBench() {}

    public static void main(String[] argv) throws Exception {
        String brokers = envOr("CAUDAL_KAFKA_BROKERS", "127.0.0.1:9092");
        String registryUrl = envOr("CAUDAL_SCHEMA_REGISTRY", "http://127.0.0.1:8085");
        String input = null;
        int parallelism = 1;
        List<String> modes = List.of("exactly-once");
        int runs = 1;
        double checkpointInterval = 1.0;
        int warmupRuns = 1;
        String avro = "specific";
        long expected = -1;
        long produce = 0;
        long sensors = 1000;
        boolean header = true;
        boolean deleteTopics = false;
        Map<String, String> extra = new LinkedHashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String flag = argv[i];
            if (flag.equals("--no-header")) {
                header = false;
                continue;
            }
            if (flag.equals("--delete-topics")) {
                deleteTopics = true;
                continue;
            }
            if (i + 1 >= argv.length) {
                throw new IllegalArgumentException(flag + " needs a value");
            }
            String v = argv[++i];
            switch (flag) {
                case "--brokers" -> brokers = v;
                case "--schema-registry" -> registryUrl = v;
                case "--input-topic" -> input = v;
                case "--parallelism" -> parallelism = Integer.parseInt(v);
                case "--delivery" -> modes = List.of(v.split(","));
                case "--runs" -> runs = Integer.parseInt(v);
                case "--checkpoint-interval" -> checkpointInterval = Double.parseDouble(v);
                case "--warmup-runs" -> warmupRuns = Integer.parseInt(v);
                case "--avro" -> avro = v;
                case "--records" -> expected = Long.parseLong(v);
                case "--produce" -> produce = Long.parseLong(v);
                case "--sensors" -> sensors = Long.parseLong(v);
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
        boolean generic = ConfluentAvro.isGeneric(avro);
        for (String m : modes) {
            DeliveryGuarantee d = delivery(m);
            if (d == DeliveryGuarantee.EXACTLY_ONCE && checkpointInterval <= 0) {
                throw new IllegalArgumentException("exactly-once commits at checkpoints: --checkpoint-interval must be > 0");
            }
        }
        if (parallelism < 1 || runs < 1 || warmupRuns < 0 || sensors < 1 || produce < 0) {
            throw new IllegalArgumentException("--parallelism, --runs and --sensors must be at least 1");
        }
        String runId = ProcessHandle.current().pid() + "-" + Long.toString(System.currentTimeMillis(), 36);
        if (input == null) {
            if (produce == 0) {
                throw new IllegalArgumentException("name the input topic (--input-topic T) or make one (--produce N)");
            }
            input = "flink-bench-in-" + produce + "-" + runId;
        }
        SchemaRegistry registry = new SchemaRegistry(registryUrl);
        List<String> created = new ArrayList<>();
        if (produce > 0) {
            ReadingsProducer.produce(brokers, registry, input, 4, produce, sensors, 1, 100);
            created.add(input);
            if (expected < 0) {
                expected = produce;
            }
        }
        Settings s = new Settings(brokers, input, registry, parallelism, checkpointInterval, generic, extra);
        try {
            for (int w = 0; w < warmupRuns; w++) {
                // A first job in the same JVM, so the measured ones run JIT-compiled code.
                String output = input + "-flink-warmup-p" + parallelism + "-" + runId + "-" + w;
                created.add(output);
                Result r = run(s, delivery(modes.get(0)), output);
                System.out.printf("# warm-up %d (%s): %d records in %.2f s%n", w, modes.get(0), r.read, r.secs);
            }
            if (header) {
                System.out.printf("%-6s %-14s %3s %10s %8s %12s %14s%n", "engine", "mode", "p", "records", "secs",
                        "records/s", "records/CPU-s");
            }
            for (String mode : modes) {
                for (int n = 0; n < runs; n++) {
                    String output = input + "-flink-" + mode + "-p" + parallelism + "-" + runId + "-" + n;
                    created.add(output);
                    Result r = run(s, delivery(mode), output);
                    System.out.printf("%-6s %-14s %3d %10d %8.2f %12.0f %14.0f%n", "flink", mode, parallelism, r.read,
                            r.secs, r.read / r.secs, r.read / Math.max(r.cpu, 0.001));
                    double net = r.result.getNetRuntime() / 1000.0;
                    System.out.printf("#   flink job net runtime %.2f s (%.0f records/s without MiniCluster start/stop);"
                            + " %.1f CPU-s; readings out %d; checkpoints %d; avro %s; into %s%n", net, r.read / net,
                            r.cpu, r.kept, r.checkpoints, avro, output);
                    if (expected >= 0 && r.read != expected) {
                        throw new IllegalStateException(
                                "read " + r.read + " records, expected " + expected + " (--records)");
                    }
                }
            }
        } finally {
            if (deleteTopics && !created.isEmpty()) {
                try (Admin admin = ReadingsProducer.admin(brokers)) {
                    admin.deleteTopics(created).all().get();
                }
                System.out.printf("# deleted %d topics%n", created.size());
            }
        }
    }

    record Settings(String brokers, String input, SchemaRegistry registry, int parallelism,
            double checkpointInterval, boolean generic, Map<String, String> extra) {}

    record Result(long read, long kept, double secs, double cpu, long checkpoints, JobExecutionResult result) {}

    static DeliveryGuarantee delivery(String mode) {
        return switch (mode) {
            case "exactly-once" -> DeliveryGuarantee.EXACTLY_ONCE;
            case "at-least-once" -> DeliveryGuarantee.AT_LEAST_ONCE;
            case "none" -> DeliveryGuarantee.NONE;
            default -> throw new IllegalArgumentException(
                    "--delivery takes exactly-once, at-least-once or none, got " + mode);
        };
    }

    /** One job into a new output topic; the topic and the schema registration come before
     *  the clock starts (Caudal's runner creates its output topic before it too). */
    private static Result run(Settings s, DeliveryGuarantee delivery, String output) throws Exception {
        ReadingsProducer.createTopic(s.brokers(), output, 2);
        int schemaId = s.registry().register(output + "-value", ConfluentAvro.PROCESSED_READING_AVSC);
        Configuration conf = new Configuration();
        conf.set(PipelineOptions.OBJECT_REUSE, true);
        // A failure ends the run instead of restarting the job for ever.
        conf.set(RestartStrategyOptions.RESTART_STRATEGY, "none");
        conf.addAll(Configuration.fromMap(s.extra()));
        Path checkpoints = null;
        if (s.checkpointInterval() > 0) {
            checkpoints = Files.createTempDirectory("flink-kafka-bench-");
            conf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, checkpoints.toUri().toString());
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(s.parallelism(), conf);
        if (s.checkpointInterval() > 0) {
            env.enableCheckpointing((long) (s.checkpointInterval() * 1000));
        }
        KafkaPipeline.build(env, new KafkaPipeline.Topics(s.brokers(), s.input(), output, schemaId), s.registry(),
                s.generic(), delivery);
        long read0 = KafkaPipeline.READ.get();
        long kept0 = KafkaPipeline.KEPT.get();
        KafkaPipeline.CHECKPOINTS.set(0);
        try {
            double cpu0 = ProcFs.cpuSeconds();
            long t0 = System.nanoTime();
            JobExecutionResult result = env.execute("kafka-bench");
            double secs = (System.nanoTime() - t0) / 1e9;
            double cpu = ProcFs.cpuSeconds() - cpu0;
            return new Result(KafkaPipeline.READ.get() - read0, KafkaPipeline.KEPT.get() - kept0, secs, cpu,
                    KafkaPipeline.CHECKPOINTS.get(), result);
        } finally {
            if (checkpoints != null) {
                try (var paths = Files.walk(checkpoints)) {
                    paths.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
                }
            }
        }
    }

    private static String envOr(String name, String fallback) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? fallback : v;
    }
}
