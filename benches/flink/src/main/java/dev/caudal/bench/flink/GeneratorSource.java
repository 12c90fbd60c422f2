package dev.caudal.bench.flink;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import org.apache.flink.api.connector.source.Boundedness;
import org.apache.flink.api.connector.source.ReaderOutput;
import org.apache.flink.api.connector.source.Source;
import org.apache.flink.api.connector.source.SourceOutput;
import org.apache.flink.api.connector.source.SourceReader;
import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.api.connector.source.SourceSplit;
import org.apache.flink.api.connector.source.SplitEnumerator;
import org.apache.flink.api.connector.source.SplitEnumeratorContext;
import org.apache.flink.core.io.InputStatus;
import org.apache.flink.core.io.SimpleVersionedSerializer;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;

/**
 * The sensor generator as a bounded FLIP-27 source with Caudal's split scheme: split k is
 * read by subtask k % parallelism; a reader emits 128 records from one split, then moves to
 * the next (as Caudal's GeneratorReader does unthrottled), each split with its own
 * watermark output. The position of a split is its next sequence number.
 */
final class GeneratorSource implements Source<SensorReading, GeneratorSource.Split, List<GeneratorSource.Split>> {
    /** Records emitted from one split before moving to the next. */
    static final int CHUNK = 128;

    private final SensorModel model;

    GeneratorSource(SensorModel model) {
        this.model = model;
    }

    @Override
    public Boundedness getBoundedness() {
        return Boundedness.BOUNDED;
    }

    @Override
    public SplitEnumerator<Split, List<Split>> createEnumerator(SplitEnumeratorContext<Split> ctx) {
        List<Split> splits = new ArrayList<>();
        for (int k = 0; k < model.splits; k++) {
            splits.add(new Split(k, 0, model.splitRecords(k)));
        }
        return new Enumerator(ctx, splits);
    }

    @Override
    public SplitEnumerator<Split, List<Split>> restoreEnumerator(SplitEnumeratorContext<Split> ctx, List<Split> state) {
        return new Enumerator(ctx, new ArrayList<>(state));
    }

    @Override
    public SimpleVersionedSerializer<Split> getSplitSerializer() {
        return new SplitSerializer();
    }

    @Override
    public SimpleVersionedSerializer<List<Split>> getEnumeratorCheckpointSerializer() {
        return new SplitListSerializer();
    }

    @Override
    public SourceReader<SensorReading, Split> createReader(SourceReaderContext ctx) {
        return new Reader(model);
    }

    /** One shard of the sensors: its index, next sequence number and end. */
    static final class Split implements SourceSplit {
        final int k;
        long next;
        final long end;

        Split(int k, long next, long end) {
            this.k = k;
            this.next = next;
            this.end = end;
        }

        @Override
        public String splitId() {
            return Integer.toString(k);
        }
    }

    /** Hands each reader the splits k with k % parallelism == subtask, then no more. */
    private static final class Enumerator implements SplitEnumerator<Split, List<Split>> {
        private final SplitEnumeratorContext<Split> ctx;
        private final List<Split> unassigned;

        Enumerator(SplitEnumeratorContext<Split> ctx, List<Split> unassigned) {
            this.ctx = ctx;
            this.unassigned = unassigned;
        }

        @Override
        public void start() {}

        @Override
        public void handleSplitRequest(int subtask, String host) {}

        @Override
        public void addSplitsBack(List<Split> splits, int subtask) {
            unassigned.addAll(splits);
            if (ctx.registeredReaders().containsKey(subtask)) {
                addReader(subtask);
            }
        }

        @Override
        public void addReader(int subtask) {
            int parallelism = ctx.currentParallelism();
            List<Split> mine = new ArrayList<>();
            unassigned.removeIf(s -> s.k % parallelism == subtask && mine.add(s));
            for (Split s : mine) {
                ctx.assignSplit(s, subtask);
            }
            ctx.signalNoMoreSplits(subtask);
        }

        @Override
        public List<Split> snapshotState(long checkpointId) {
            return new ArrayList<>(unassigned);
        }

        @Override
        public void close() {}
    }

    /** Emits its splits round-robin, CHUNK records at a time, each through its own output. */
    private static final class Reader implements SourceReader<SensorReading, Split> {
        private final SensorModel model;
        private final List<Split> splits = new ArrayList<>();
        /** At each split's next sequence number. */
        private final List<SensorModel.Cursor> cursors = new ArrayList<>();
        private CompletableFuture<Void> available = new CompletableFuture<>();
        private boolean noMoreSplits;
        private int cursor;
        private long emitted;
        private long lastCompletedCheckpoint;

        Reader(SensorModel model) {
            this.model = model;
        }

        @Override
        public void start() {}

        @Override
        public InputStatus pollNext(ReaderOutput<SensorReading> output) {
            if (splits.isEmpty()) {
                return noMoreSplits ? InputStatus.END_OF_INPUT : InputStatus.NOTHING_AVAILABLE;
            }
            cursor %= splits.size();
            Split s = splits.get(cursor);
            SensorModel.Cursor at = cursors.get(cursor);
            SourceOutput<SensorReading> out = output.createOutputForSplit(s.splitId());
            long take = Math.min(CHUNK, s.end - s.next);
            for (long i = 0; i < take; i++) {
                out.collect(at.next());
            }
            s.next += take;
            emitted += take;
            if (s.next >= s.end) {
                output.releaseOutputForSplit(s.splitId());
                splits.remove(cursor);
                cursors.remove(cursor);
            } else {
                cursor++;
            }
            if (splits.isEmpty() && noMoreSplits) {
                return InputStatus.END_OF_INPUT;
            }
            return splits.isEmpty() ? InputStatus.NOTHING_AVAILABLE : InputStatus.MORE_AVAILABLE;
        }

        @Override
        public List<Split> snapshotState(long checkpointId) {
            List<Split> copy = new ArrayList<>();
            for (Split s : splits) {
                copy.add(new Split(s.k, s.next, s.end));
            }
            return copy;
        }

        @Override
        public CompletableFuture<Void> isAvailable() {
            return available;
        }

        @Override
        public void addSplits(List<Split> added) {
            for (Split s : added) {
                splits.add(s);
                cursors.add(model.new Cursor(s.k, s.next));
            }
            available.complete(null);
        }

        @Override
        public void notifyNoMoreSplits() {
            noMoreSplits = true;
            available.complete(null);
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            lastCompletedCheckpoint = Math.max(lastCompletedCheckpoint, checkpointId);
        }

        @Override
        public void close() {
            CountingSink.COUNTS.addAndGet(CountingSink.SOURCE, emitted);
            TemperatureBench.CHECKPOINTS.accumulateAndGet(lastCompletedCheckpoint, Math::max);
        }
    }

    private static final class SplitSerializer implements SimpleVersionedSerializer<Split> {
        @Override
        public int getVersion() {
            return 1;
        }

        @Override
        public byte[] serialize(Split s) throws IOException {
            DataOutputSerializer out = new DataOutputSerializer(20);
            out.writeInt(s.k);
            out.writeLong(s.next);
            out.writeLong(s.end);
            return out.getCopyOfBuffer();
        }

        @Override
        public Split deserialize(int version, byte[] bytes) throws IOException {
            DataInputDeserializer in = new DataInputDeserializer(bytes);
            return new Split(in.readInt(), in.readLong(), in.readLong());
        }
    }

    private static final class SplitListSerializer implements SimpleVersionedSerializer<List<Split>> {
        private final SplitSerializer one = new SplitSerializer();

        @Override
        public int getVersion() {
            return 1;
        }

        @Override
        public byte[] serialize(List<Split> splits) throws IOException {
            DataOutputSerializer out = new DataOutputSerializer(4 + 20 * splits.size());
            out.writeInt(splits.size());
            for (Split s : splits) {
                out.write(one.serialize(s));
            }
            return out.getCopyOfBuffer();
        }

        @Override
        public List<Split> deserialize(int version, byte[] bytes) throws IOException {
            DataInputDeserializer in = new DataInputDeserializer(bytes);
            int n = in.readInt();
            List<Split> splits = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                splits.add(new Split(in.readInt(), in.readLong(), in.readLong()));
            }
            return splits;
        }
    }
}
