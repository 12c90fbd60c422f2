package dev.caudal.bench.flink;

import java.util.concurrent.atomic.AtomicLongArray;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;

/**
 * Counts and drops records, like Caudal's DiscardSink. Each writer counts in a plain field
 * and adds its total to a JVM-wide counter when it closes (the MiniCluster runs in this JVM).
 */
final class CountingSink<T> implements Sink<T> {
    static final int READINGS = 0;
    static final int WINDOWS = 1;
    static final int SOURCE = 2;
    /** The keyed process function's output: timers fired (timers), alerts (alerts). */
    static final int OUTPUTS = 3;
    /** Readings out, windows out, source records, process-function outputs. */
    static final AtomicLongArray COUNTS = new AtomicLongArray(4);

    private final int counter;

    CountingSink(int counter) {
        this.counter = counter;
    }

    @Override
    public SinkWriter<T> createWriter(WriterInitContext context) {
        return new Writer<>(counter);
    }

    private static final class Writer<T> implements SinkWriter<T> {
        private final int counter;
        private long count;

        Writer(int counter) {
            this.counter = counter;
        }

        @Override
        public void write(T element, Context context) {
            count++;
        }

        @Override
        public void flush(boolean endOfInput) {}

        @Override
        public void close() {
            COUNTS.addAndGet(counter, count);
        }
    }
}
