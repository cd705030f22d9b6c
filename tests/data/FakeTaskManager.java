// A JVM whose threads carry the names a Flink TaskManager gives its subtasks, for
// tests/test_agent_engine.py: real threads, named by the test, listed by a real
// `jcmd <pid> Thread.print`, capped through real cgroups. No Flink inside.
//
// Usage: java -cp DIR FakeTaskManager <token>   (the token makes its command line unique)
// Commands on stdin, one a line; each is answered "ok" on stdout once done:
//   start <thread name>   a thread that sleeps
//   busy <thread name>    a thread that spins on SHA-256
//   stop <thread name>    stops and joins every thread of that name
//   quit
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.List;

public final class FakeTaskManager {
    private static final List<Thread> THREADS = new ArrayList<>();

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            int space = line.indexOf(' ');
            String op = space < 0 ? line : line.substring(0, space);
            String name = space < 0 ? "" : line.substring(space + 1);
            switch (op) {
                case "start" -> start(name, false);
                case "busy" -> start(name, true);
                case "stop" -> stop(name);
                case "quit" -> {
                    System.out.println("ok");
                    System.out.flush();
                    System.exit(0);
                }
                default -> {
                    System.out.println("error unknown op " + op);
                    System.out.flush();
                    continue;
                }
            }
            System.out.println("ok");
            System.out.flush();
        }
        System.exit(0);
    }

    private static void start(String name, boolean busy) {
        Thread t = new Thread(() -> run(busy), name);
        t.setDaemon(true);
        t.start();
        THREADS.add(t);
    }

    private static void run(boolean busy) {
        try {
            if (!busy) {
                Thread.sleep(Long.MAX_VALUE);
                return;
            }
            MessageDigest sha = MessageDigest.getInstance("SHA-256");
            byte[] buf = new byte[4096];
            while (!Thread.currentThread().isInterrupted()) {
                buf = sha.digest(buf);
            }
        } catch (InterruptedException e) {
            // stopped by the test
        } catch (Exception e) {
            throw new RuntimeException(e);
        }
    }

    private static void stop(String name) throws InterruptedException {
        List<Thread> gone = new ArrayList<>();
        for (Thread t : THREADS) {
            if (t.getName().equals(name)) {
                t.interrupt();
                t.join();
                gone.add(t);
            }
        }
        THREADS.removeAll(gone);
    }
}
