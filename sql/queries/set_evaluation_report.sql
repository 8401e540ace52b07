UPDATE corpusync.evaluations SET report_path = %(report_path)s WHERE id = %(id)s
