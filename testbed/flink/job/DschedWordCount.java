// The dsched Flink testbed job: a streaming SQL word count with a stateful GROUP BY.
//
// Usage: flink run -p N -c dsched.flink.DschedWordCount job.jar
//            <input dir> <job name> [<latency dir> | -] [<cost rounds>]
//
// Pipeline (operator chaining is off in the cluster's config, so every step is
// its own vertex and its own thread per subtask; four vertices in all):
//
//   Source: src[1]      filesystem source monitoring <input dir> every 200 ms
//                       (CSV lines: id BIGINT, word STRING, ts BIGINT epoch ms)
//   Calc[2]             DSCHED_WORK: <cost rounds> chained SHA-256 digests per record,
//                       the CPU the controller has to provision (tunable from outside)
//   GroupAggregate[4]   COUNT(*), MAX(ts) per word (keyed state)
//   lat[5]: Writer      the latency sink below, a sink v2 writer
//
// The sink is a table connector ("dsched-latency", found through the service file
// that testbed/flink/job.py puts into the jar) rather than toChangelogStream + map +
// DiscardingSink: the table path adds no TableToDataStream vertex. It takes upserts
// (so the aggregate sends no UPDATE_BEFORE rows: one row per input record) and
// declares no primary key and no NOT NULL column, either of which would add a
// ConstraintEnforcer vertex.
//
// Latency: for every +I/+U row the sink computes now - ts, where ts = MAX(ts) of
// the word, i.e. the write time of the record that caused this update (the feeder
// stamps ts monotonically). Counters dschedLatencyCount / dschedLatencySumMs on the
// writer's metric group; with a latency dir, every value (ms) is also appended to
// <latency dir>/<job name>-<subtask>-<attempt>.lat (0-based subtask index), one
// integer per line, flushed about once a second and on close.
package dsched.flink;

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HashSet;
import java.util.Set;

import org.apache.flink.api.common.TaskInfo;
import org.apache.flink.api.common.operators.ProcessingTimeService;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.ReadableConfig;
import org.apache.flink.metrics.Counter;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.connector.sink.DynamicTableSink;
import org.apache.flink.table.connector.sink.SinkV2Provider;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.factories.DynamicTableSinkFactory;
import org.apache.flink.table.factories.FactoryUtil;
import org.apache.flink.table.functions.ScalarFunction;
import org.apache.flink.types.RowKind;

public final class DschedWordCount {

    /** Chained SHA-256 digests per record when no cost is given. */
    static final int DEFAULT_ROUNDS = 2500;

    public static void main(String[] args) throws Exception {
        if (args.length < 2 || args.length > 4) {
            System.err.println(
                    "usage: DschedWordCount <input dir> <job name> [<latency dir> | -] [<cost rounds>]");
            System.exit(2);
        }
        String inputDir = args[0];
        String jobName = args[1];
        String latencyDir = args.length >= 3 && !args[2].equals("-") ? args[2] : "";
        int rounds = args.length >= 4 ? Integer.parseInt(args[3]) : DEFAULT_ROUNDS;
        if (rounds < 1) {
            throw new IllegalArgumentException("cost rounds must be >= 1, got " + rounds);
        }

        TableEnvironment t = TableEnvironment.create(EnvironmentSettings.inStreamingMode());
        t.getConfig().set("pipeline.name", jobName);

        t.executeSql(
                "CREATE TEMPORARY TABLE src ("
                        + " id BIGINT NOT NULL, word STRING NOT NULL, ts BIGINT NOT NULL"
                        + ") WITH ("
                        + " 'connector' = 'filesystem',"
                        + " 'path' = '" + sqlString(inputDir) + "',"
                        + " 'format' = 'csv',"
                        + " 'source.monitor-interval' = '200ms')");
        t.executeSql(
                "CREATE TEMPORARY TABLE lat ("
                        + " w STRING, cnt BIGINT, ts BIGINT"
                        + ") WITH ("
                        + " 'connector' = '" + LatencySinkFactory.IDENTIFIER + "',"
                        + " 'job-name' = '" + sqlString(jobName) + "',"
                        + " 'latency-dir' = '" + sqlString(latencyDir) + "')");

        // The hash chain is the per-record CPU cost. It feeds a filter that is always
        // true (a hex digest is never empty) so the planner cannot prune it.
        t.createTemporarySystemFunction("DSCHED_WORK", Work.class);
        t.executeSql(
                "INSERT INTO lat SELECT w, COUNT(*) AS cnt, MAX(ts) AS ts FROM ("
                        + " SELECT word AS w, ts FROM src"
                        + " WHERE DSCHED_WORK(CONCAT(word, CAST(id AS STRING)), " + rounds + ") <> ''"
                        + ") GROUP BY w");
    }

    private static String sqlString(String s) {
        return s.replace("'", "''");
    }

    /**
     * The per-record CPU cost: {@code rounds} chained SHA-256 digests of the input,
     * the hex of the last one's first 8 bytes. Deterministic, so the same record
     * always costs the same; a loop rather than nested SQL SHA256 calls because
     * hundreds of nested calls make the generated code unwieldy.
     */
    public static final class Work extends ScalarFunction {
        private transient MessageDigest sha;

        public String eval(String s, int rounds) throws NoSuchAlgorithmException {
            if (sha == null) {
                sha = MessageDigest.getInstance("SHA-256");
            }
            byte[] digest = s.getBytes(StandardCharsets.UTF_8);
            for (int i = 0; i < rounds; i++) {
                digest = sha.digest(digest);
            }
            StringBuilder hex = new StringBuilder(16);
            for (int i = 0; i < 8; i++) {
                hex.append(Character.forDigit((digest[i] >> 4) & 0xf, 16));
                hex.append(Character.forDigit(digest[i] & 0xf, 16));
            }
            return hex.toString();
        }
    }

    /** The "dsched-latency" table connector. */
    public static final class LatencySinkFactory implements DynamicTableSinkFactory {
        static final String IDENTIFIER = "dsched-latency";
        static final ConfigOption<String> JOB_NAME =
                ConfigOptions.key("job-name").stringType().defaultValue("job");
        static final ConfigOption<String> LATENCY_DIR =
                ConfigOptions.key("latency-dir").stringType().defaultValue("");

        @Override
        public String factoryIdentifier() {
            return IDENTIFIER;
        }

        @Override
        public Set<ConfigOption<?>> requiredOptions() {
            return new HashSet<>();
        }

        @Override
        public Set<ConfigOption<?>> optionalOptions() {
            Set<ConfigOption<?>> options = new HashSet<>();
            options.add(JOB_NAME);
            options.add(LATENCY_DIR);
            return options;
        }

        @Override
        public DynamicTableSink createDynamicTableSink(Context context) {
            FactoryUtil.TableFactoryHelper helper = FactoryUtil.createTableFactoryHelper(this, context);
            helper.validate();
            ReadableConfig options = helper.getOptions();
            int tsIndex = context.getPhysicalRowDataType().getChildren().size() - 1;
            return new LatencyTableSink(options.get(JOB_NAME), options.get(LATENCY_DIR), tsIndex);
        }
    }

    static final class LatencyTableSink implements DynamicTableSink {
        private final String jobName;
        private final String latencyDir;
        private final int tsIndex;

        LatencyTableSink(String jobName, String latencyDir, int tsIndex) {
            this.jobName = jobName;
            this.latencyDir = latencyDir;
            this.tsIndex = tsIndex;
        }

        @Override
        public ChangelogMode getChangelogMode(ChangelogMode requestedMode) {
            // Upserts (no UPDATE_BEFORE): the aggregate then sends one row per input
            // record. No primary key is declared: Flink would put a NotNullEnforcer
            // vertex in front of the sink for the key column.
            return ChangelogMode.upsert();
        }

        @Override
        public SinkRuntimeProvider getSinkRuntimeProvider(Context context) {
            return SinkV2Provider.of(new LatencySink(jobName, latencyDir, tsIndex));
        }

        @Override
        public DynamicTableSink copy() {
            return new LatencyTableSink(jobName, latencyDir, tsIndex);
        }

        @Override
        public String asSummaryString() {
            return "dsched-latency";
        }
    }

    static final class LatencySink implements Sink<RowData> {
        private static final long serialVersionUID = 1L;
        private final String jobName;
        private final String latencyDir;
        private final int tsIndex;

        LatencySink(String jobName, String latencyDir, int tsIndex) {
            this.jobName = jobName;
            this.latencyDir = latencyDir;
            this.tsIndex = tsIndex;
        }

        @Override
        public SinkWriter<RowData> createWriter(WriterInitContext context) throws IOException {
            return new LatencyWriter(context, jobName, latencyDir, tsIndex);
        }
    }

    static final class LatencyWriter implements SinkWriter<RowData> {
        private static final long FLUSH_MS = 1000;

        private final int tsIndex;
        private final Counter count;
        private final Counter sumMs;
        private final BufferedWriter out; // null without a latency dir
        private final ProcessingTimeService timers;
        private boolean closed;

        LatencyWriter(WriterInitContext context, String jobName, String latencyDir, int tsIndex)
                throws IOException {
            this.tsIndex = tsIndex;
            this.count = context.metricGroup().counter("dschedLatencyCount");
            this.sumMs = context.metricGroup().counter("dschedLatencySumMs");
            this.timers = context.getProcessingTimeService();
            if (latencyDir.isEmpty()) {
                this.out = null;
                return;
            }
            TaskInfo task = context.getTaskInfo();
            Path dir = Paths.get(latencyDir);
            Files.createDirectories(dir);
            Path file = dir.resolve(
                    jobName + "-" + task.getIndexOfThisSubtask() + "-" + task.getAttemptNumber() + ".lat");
            // A 64 KiB buffer holds several seconds at the testbed's rates; the
            // timer below bounds how stale the file can be, independent of traffic.
            this.out = new BufferedWriter(
                    Files.newBufferedWriter(
                            file,
                            StandardCharsets.US_ASCII,
                            StandardOpenOption.CREATE,
                            StandardOpenOption.APPEND),
                    1 << 16);
            scheduleFlush();
        }

        private void scheduleFlush() {
            // Timer callbacks run in the task's mailbox thread, so they never race write().
            timers.registerTimer(timers.getCurrentProcessingTime() + FLUSH_MS, ts -> {
                if (closed) {
                    return;
                }
                out.flush();
                scheduleFlush();
            });
        }

        @Override
        public void write(RowData row, Context context) throws IOException {
            RowKind kind = row.getRowKind();
            if (kind != RowKind.INSERT && kind != RowKind.UPDATE_AFTER) {
                return; // a retraction or delete is not a result the user waits for
            }
            long latency = System.currentTimeMillis() - row.getLong(tsIndex);
            count.inc();
            sumMs.inc(latency);
            if (out != null) {
                out.write(Long.toString(latency));
                out.write('\n');
            }
        }

        @Override
        public void flush(boolean endOfInput) throws IOException {
            if (out != null) {
                out.flush();
            }
        }

        @Override
        public void close() throws IOException {
            closed = true;
            if (out != null) {
                out.close();
            }
        }
    }
}
