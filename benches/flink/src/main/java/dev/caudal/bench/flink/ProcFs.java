package dev.caudal.bench.flink;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/** CPU time and memory of this process from /proc, read as Caudal's runners read them. */
final class ProcFs {
    private ProcFs() {}

    /** User + system CPU seconds of this process (clock ticks of 10 ms). */
    static double cpuSeconds() {
        try {
            String stat = Files.readString(Path.of("/proc/self/stat"));
            String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
            // After the command: state is index 0; utime is field 14 overall, index 11.
            return (Long.parseLong(f[11]) + Long.parseLong(f[12])) / 100.0;
        } catch (IOException | RuntimeException e) {
            return 0.0;
        }
    }

    /** A "Key:   N kB" line of /proc/self/status, in kB (0 when absent). */
    static long statusKb(String key) {
        try {
            for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
                if (line.startsWith(key)) {
                    return Long.parseLong(line.substring(key.length()).trim().split("\\s+")[0]);
                }
            }
        } catch (IOException | RuntimeException e) {
            return 0;
        }
        return 0;
    }
}
